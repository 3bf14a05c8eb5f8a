"""``trainer.optimizer_impl``: the compiled optimizer step against the eager one (the oracle), in
float64 over several seeds and through stage ends; the fallback to eager when compiling fails;
and through ``train.py``'s loop (recorded in ``results.json``, a resume on the same form repeats
the uninterrupted run bit for bit, a resume that changes the form is refused)."""
from __future__ import annotations

import json

import pytest
import torch

from lpmetrics.baselines.ppd_optim import PPDAdaGrad, PPDSG
from lpmetrics.errors import ConfigError
from lpmetrics.run import loop
from lpmetrics.run.optimizer_step import build_step, public
from lpmetrics.run.runfolder import ResumeConfigError
from lpmetrics.run.validate import validate

SHORT = ["dataset=digits", "model=mlp", "trainer.max_steps=20", "trainer.eval_every=10",
         "trainer.batch_size=32", "device=cpu", "logger=csv"]


def _ppd_problem(cls, seed: int):
    """A model's weights (L2), an objective's primal scalars (no L2) and a dual variable (ascent),
    in float64, with stages of 3, 9, ... steps."""
    g = torch.Generator().manual_seed(seed)
    weights = [torch.nn.Parameter(torch.randn(4, 3, generator=g, dtype=torch.float64)),
               torch.nn.Parameter(torch.randn(5, generator=g, dtype=torch.float64)),
               torch.nn.Parameter(torch.randn(2, 2, generator=g, dtype=torch.float64))]
    primal = [torch.nn.Parameter(torch.zeros((), dtype=torch.float64)) for _ in range(2)]
    dual = torch.nn.Parameter(torch.zeros((), dtype=torch.float64))
    opt = cls([{"params": weights}, {"params": primal, "weight_decay": 0.0},
               {"params": [dual], "ascent": True, "weight_decay": 0.0}],
              lr=0.1, gamma=50.0, T0=3, weight_decay=1e-2)
    return [*weights, *primal, dual], opt


def same_random_gradients(eager_params, params, g) -> None:
    for a, b in zip(eager_params, params):
        a.grad = torch.randn(a.shape, generator=g, dtype=torch.float64)
        b.grad = a.grad.clone()


def equal_to_rounding(eager_params, params) -> None:
    for a, b in zip(eager_params, params):
        torch.testing.assert_close(b, a, rtol=1e-12, atol=1e-13)


def counting(calls: list):
    """``torch.compile`` that notes the size of each call's parameter list (so a test sees the
    compiled function ran, per group) and how many frames dynamo compiled."""
    from torch._dynamo.utils import counters

    def compile_fn(fn, **kwargs):
        compiled = torch.compile(fn, **kwargs)

        def call(*args):
            calls.append(len(args[0]))
            return compiled(*args)
        return call
    calls.append(sum(counters["stats"].values()))
    return compile_fn


@pytest.mark.parametrize("cls", [PPDSG, PPDAdaGrad])
def test_compiled_ppd_step_is_the_eager_step(cls):
    for seed in range(4):
        (eager_params, eager), (params, opt) = _ppd_problem(cls, seed), _ppd_problem(cls, seed)
        calls = []
        step, record = build_step(opt, "compiled", compile_fn=counting(calls))
        g = torch.Generator().manual_seed(100 + seed)
        for t in range(14):   # stage ends after steps 3 and 12: averaging, lr / 3, a new reference
            grads = [torch.randn(p.shape, generator=g, dtype=torch.float64) for p in params]
            if t == 5:
                grads[1] = None   # a parameter without a gradient: its group steps eagerly once
            for a, b, grad in zip(eager_params, params, grads):
                a.grad = None if grad is None else grad.clone()
                b.grad = None if grad is None else grad.clone()
            eager.step()
            step()
            assert opt.stage_ended == eager.stage_ended, (seed, t)
            equal_to_rounding(eager_params, params)
        assert opt.state_dict()["stages"] == eager.state_dict()["stages"] == \
            {"stage": 3, "stage_step": 2, "stage_len": 27}
        assert opt.param_groups[0]["lr"] == eager.param_groups[0]["lr"]
        for p, q in zip(eager_params, params):
            for key, value in eager.state[p].items():
                torch.testing.assert_close(opt.state[q][key], value, rtol=1e-12, atol=1e-13)
        assert public(record)["impl"] == "compiled" and record["form"] == "the optimizer's own"
        # the weights (3 tensors) and the primal scalars (2) went through the compiled function at
        # every step after the first, but the weights' at step 5 (a missing gradient: eager)
        assert sorted(calls[1:]) == [2] * 13 + [3] * 12
        if seed == 0:
            from torch._dynamo.utils import counters
            assert sum(counters["stats"].values()) > calls[0]   # dynamo compiled, not skipped


def test_a_group_that_fails_to_compile_is_stepped_once_and_the_run_goes_on_eagerly():
    """The weights' group compiles, the primal scalars' does not: that step finishes eagerly from
    the failed group on (no group stepped twice), and every later step is eager."""
    def scalars_fail(fn, **kwargs):
        compiled = torch.compile(fn, **kwargs)

        def call(*args):
            if args[0][0].dim() == 0:
                raise RuntimeError("cannot compile this group (test)")
            return compiled(*args)
        return call

    (eager_params, eager), (params, opt) = _ppd_problem(PPDAdaGrad, 0), _ppd_problem(PPDAdaGrad, 0)
    step, record = build_step(opt, "compiled", compile_fn=scalars_fail)
    g = torch.Generator().manual_seed(7)
    for t in range(6):
        same_random_gradients(eager_params, params, g)
        eager.step()
        if t == 1:
            with pytest.warns(RuntimeWarning, match="cannot compile this group"):
                step()
        else:
            step()
        equal_to_rounding(eager_params, params)
    assert record["impl"] == "eager" and "cannot compile this group" in record["fallback"]
    _, later = build_step(_ppd_problem(PPDAdaGrad, 1)[1], "compiled", earlier=[None, dict(record)])
    assert later["impl"] == "eager" and later["fallback"].startswith("an earlier launch of this run fell back")


def test_compiled_sgd_step_is_the_eager_step_across_lr_drops():
    def problem():
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2)).double()
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)
        return list(model.parameters()), opt, torch.optim.lr_scheduler.MultiStepLR(opt, [3, 6], 1 / 3)

    (eager_params, eager, eager_lr), (params, opt, lr) = problem(), problem()
    step, record = build_step(opt, "compiled")
    g = torch.Generator().manual_seed(3)
    for _ in range(9):
        same_random_gradients(eager_params, params, g)
        eager.step()
        step()
        eager_lr.step()
        lr.step()
        equal_to_rounding(eager_params, params)
    assert record["impl"] == "compiled" and record["form"] == "torch.compile(optimizer.step)"
    assert record["compile_s"] > 0


def test_a_compile_failure_steps_eagerly_and_says_why():
    def broken(fn, **_):
        def call(*args, **kwargs):
            raise RuntimeError("no C++ compiler (test)")
        return call

    (eager_params, eager), (params, opt) = _ppd_problem(PPDAdaGrad, 0), _ppd_problem(PPDAdaGrad, 0)
    step, record = build_step(opt, "compiled", compile_fn=broken)
    for t in range(4):
        for a, b in zip(eager_params, params):
            a.grad = torch.full_like(a, 0.1 * (t + 1))
            b.grad = a.grad.clone()
        eager.step()
        if t == 1:   # the first step makes the state eagerly; the second calls the compiled form
            with pytest.warns(RuntimeWarning, match="no C.. compiler.*steps eagerly"):
                step()
        else:
            step()
        for a, b in zip(eager_params, params):
            assert torch.equal(a, b)
    assert record["impl"] == "eager" and record["requested"] == "compiled"
    assert "no C++ compiler" in record["fallback"]


def test_bad_values_are_refused(compose_cfg, monkeypatch):
    with pytest.raises(ConfigError, match="trainer.optimizer_impl='fused' must be one of eager, compiled"):
        validate(compose_cfg([*SHORT, "trainer.optimizer_impl=fused"]))
    import lpmetrics.run.validate as validate_module
    monkeypatch.setattr(validate_module, "resolve_device", lambda name: torch.device("cuda"))
    with pytest.raises(ConfigError, match="optimizer_impl=compiled is tested on CPUs only.*use eager"):
        validate(compose_cfg([*SHORT, "trainer.optimizer_impl=compiled"]))
    validate(compose_cfg(SHORT))


@pytest.mark.parametrize("impl", ["eager", "compiled"])
def test_a_ppd_run_resumed_before_a_stage_end_repeats_itself(compose_cfg, tmp_path, impl):
    """Stages of 4, 12, ... steps: the resume at step 10 is 6 steps before a stage end, whose alpha
    reset reads the last 1,024 examples seen (32 batches here), most of them from before the
    resume: they come back with the checkpoint."""
    args = [*SHORT, "objective=ppd_adagrad", "optimizer.T0=4", f"trainer.optimizer_impl={impl}"]
    full = loop.train(compose_cfg(args), tmp_path / "full")
    loop.train(compose_cfg([*args, "trainer.max_steps=10"]), tmp_path / "split")
    resumed = loop.train(compose_cfg([*args, "resume=true"]), tmp_path / "split")
    assert resumed["final"] == full["final"]
    a = torch.load(tmp_path / "full" / "last.pt", weights_only=True)
    b = torch.load(tmp_path / "split" / "last.pt", weights_only=True)
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    on_disk = json.loads((tmp_path / "full" / "results.json").read_text())
    record = on_disk["optimizer_impl"]
    assert record["requested"] == record["impl"] == impl and record["optimizer"] == "PPDAdaGrad"
    assert on_disk["launches"][-1]["optimizer_impl"]["impl"] == impl
    launches = json.loads((tmp_path / "split" / "results.json").read_text())["launches"]
    assert [la["optimizer_impl"]["impl"] for la in launches] == [impl, impl]   # one record per launch
    other = "eager" if impl == "compiled" else "compiled"
    with pytest.raises(ResumeConfigError, match=f"trainer.optimizer_impl.*{impl}.*{other}"):
        loop.train(compose_cfg([*args, f"trainer.optimizer_impl={other}", "trainer.max_steps=30",
                                "resume=true"]), tmp_path / "split")


def test_an_older_ppd_checkpoint_without_the_ring_still_loads():
    from lpmetrics.baselines.ppd import SquareAUCMinMax
    objective = SquareAUCMinMax(pos_ratio=0.9, alpha_samples=8)
    objective._remember(torch.ones(4, 3), torch.tensor([0, 1, 1, 1]))
    state = objective.state_dict()
    assert torch.equal(state["_extra_state"]["ring_n"], torch.tensor(1))
    fresh = SquareAUCMinMax(pos_ratio=0.9, alpha_samples=8)
    fresh.load_state_dict(state)
    assert torch.equal(fresh.remembered()[0], objective.remembered()[0])
    older = SquareAUCMinMax(pos_ratio=0.9, alpha_samples=8)
    older.load_state_dict({k: v for k, v in state.items() if k != "_extra_state"})
    assert older.remembered()[0].numel() == 0
