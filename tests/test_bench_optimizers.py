"""``scripts.cpu.bench_optimizers`` at its smallest (one round): one line per optimizer, SGD's
ratio 1, and each step really moves the parameters it times."""
import torch

from scripts.cpu import bench_optimizers


def test_bench_optimizers_smallest(capsys):
    assert bench_optimizers.main(["--rounds", "1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("ResNet-18 (11.2M parameters), one thread, median of 1 steps:")
    rows = {ln.split()[0]: ln for ln in out.splitlines()[1:]}
    assert set(rows) == set(bench_optimizers.OPTIMIZERS) and "1.00x sgd" in rows["sgd"]


def test_each_timed_optimizer_moves_the_weights():
    for cls, kw in bench_optimizers.OPTIMIZERS.values():
        w = torch.nn.Parameter(torch.ones(4))
        w.grad = torch.full((4,), 0.5)
        opt = cls([w], **kw)
        opt.step()
        assert (w.detach() < 1).all()


def test_the_written_out_ppd_update_is_the_optimizers_step():
    """``--compiled`` times ``_ppd_update`` as the PPD optimizers' step: run eagerly (no compile),
    three steps of it match PPD-SG's and PPD-AdaGrad's own (parameters, stage sums, AdaGrad's
    squared-gradient sums) to float64 rounding, mid-stage, on random tensors of ResNet-like shapes."""
    from lpmetrics.baselines.ppd_optim import PPDAdaGrad, PPDSG

    for cls, adagrad in ((PPDSG, False), (PPDAdaGrad, True)):
        g = torch.Generator().manual_seed(int(adagrad))
        shapes = [(8, 3, 3, 3), (8,), (2, 8)]
        start = [torch.randn(s, generator=g, dtype=torch.float64) for s in shapes]
        grads = [[torch.randn(s, generator=g, dtype=torch.float64) for s in shapes] for _ in range(4)]
        params = [torch.nn.Parameter(x.clone()) for x in start]
        opt = cls(params, lr=0.05, gamma=7.0, T0=100)
        for p, gr in zip(params, grads[0]):
            p.grad = gr.clone()
        opt.step()   # the state exists; the written-out update continues from a copy of it
        twin = [p.detach().clone() for p in params]
        state = [opt.state[p] for p in params]
        refs, sums = [s["ref"].clone() for s in state], [s["sum"].clone() for s in state]
        sqs = [s["sq_sum"].clone() for s in state] if adagrad else []
        update = bench_optimizers._ppd_update(adagrad)
        group = opt.param_groups[0]
        c = group.get("delta", 0.0) + group["lr"] / group["gamma"]
        for k in range(1, 4):
            for p, gr in zip(params, grads[k]):
                p.grad = gr.clone()
            opt.step()
            with torch.no_grad():
                update(twin, grads[k], refs, sums, sqs, torch.tensor(group["lr"], dtype=torch.float64),
                       torch.tensor(group["gamma"], dtype=torch.float64), torch.tensor(c, dtype=torch.float64))
        for p, t, s, total in zip(params, twin, state, sums):
            assert torch.allclose(p.detach(), t, rtol=1e-12, atol=1e-14), cls.__name__
            assert torch.allclose(s["sum"], total, rtol=1e-12, atol=1e-14), cls.__name__
        for s, sq in zip(state, sqs):
            assert torch.allclose(s["sq_sum"], sq, rtol=1e-12, atol=1e-14)
