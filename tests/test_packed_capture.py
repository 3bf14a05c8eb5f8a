"""A pack step the device runs alone, checked on the CPU in float64.

What a CUDA graph does to a step, the stand-in :class:`Replay` does here: a replay repeats the
step's tensor work and none of its Python (its counters, lists, attribute assignments are put back
after each call), so state a step keeps on the host would stand still, as in a real replay. The
oracle is always N separate runs making ``train.py``'s calls (:class:`tests.test_packed.Run`):

- the pack-wide SGD update (:class:`packed.optim.PackedSGD`) equals N ``torch.optim.SGD`` steps to
  1e-10 (per-run lr, momentum, dampening, weight decay, nesterov; MultiStepLR milestones; a run
  frozen by a non-finite loss), and in a graph it needs one capture whatever the milestones;
- ``ppd_sg`` / ``ppd_adagrad`` packs replayed from a graph equal separate eager runs over steps
  that cross two stage ends (averaging, lr / 3, the alpha reset), and their sync-free step makes
  no host sync;
- ``auc_lp`` in packs on CUDA is trained in its dense capture-safe form (chosen from the device
  type, tested with the string ``"cuda"``), whose loss and gradient are the masked form's, and a
  captured pack of them equals separate masked runs.
"""
from __future__ import annotations

import copy

import pytest
import torch

from lpmetrics.baselines.ppd import SquareAUCMinMax
from lpmetrics.baselines.ppd_optim import PPDSG
from lpmetrics.models.mlp import MLP
from lpmetrics.objectives.auc import AUCLoss
from lpmetrics.objectives.ce import CrossEntropy
from lpmetrics.objectives.common import labels_checked
from lpmetrics.packed import PackedStep, pack, param_groups
from lpmetrics.packed.graph import GraphedStep, capturable, capture_form
from lpmetrics.packed.optim import PackedSGD, unsupported
from tests.test_auc_dense_pairs import NoHostSync
from tests.test_auc_dense_pairs import batch as auc_batch
from tests.test_packed import FLAT, NaNAfter, Run, close, configs

SHAPE = [3, 4, 4]


def _python_state(obj):
    """The host-side state of ``obj``: its attributes, and one level into the dicts and lists
    they hold (optimizer state and param groups, a module's statistics); tensors by identity."""
    inner = {}
    for k, v in vars(obj).items():
        if isinstance(v, dict):
            inner[k] = (v, dict(v), {kk: dict(vv) for kk, vv in v.items() if isinstance(vv, dict)})
        elif isinstance(v, list):
            inner[k] = (v, list(v), {j: dict(g) for j, g in enumerate(v) if isinstance(g, dict)})
    return dict(vars(obj)), inner


def _restore(obj, saved) -> None:
    attrs, inner = saved
    for container, elements, contents in inner.values():
        if isinstance(container, dict):
            container.clear()
            container.update(elements)
        else:
            container[:] = elements
        for j, content in contents.items():
            elements[j].clear()
            elements[j].update(content)
    vars(obj).clear()
    vars(obj).update(attrs)


class Replay:
    """A CUDA graph's behaviour on the CPU: the first call (the capture, then its replay) is a
    real step; later replays redo the tensor work and undo every Python side effect on the
    stepper, its update, objectives and optimizers (a graph replays kernels, not Python)."""

    def __init__(self, fn, stepper):
        self.fn, self.stepper, self.output, self.calls = fn, stepper, None, 0

    def roots(self):
        st = self.stepper
        return [st, *([st.update] if st.update is not None else []), *st.objectives, *st.optimizers]

    def replay(self):
        self.calls += 1
        if self.calls == 1:
            self.output = self.fn()
            return
        saved = [(obj, _python_state(obj)) for obj in self.roots()]
        self.output = self.fn()
        for obj, state in saved:
            _restore(obj, state)


def replayed(stepper, warmup=1):
    return GraphedStep(stepper, warmup=warmup, make_graph=lambda fn, device: Replay(fn, stepper))


def data(n, steps, batch=12, seed=2):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        y = (torch.rand(n, batch, generator=g) < 0.6).long()
        y[:, :2] = torch.tensor([0, 1])
        out.append((torch.randn(n, batch, *SHAPE, generator=g), y))
    return out


def models(n, seed=0):
    torch.manual_seed(seed)
    return [MLP(2, SHAPE, hidden=[8]) for _ in range(n)]


# --- the pack-wide SGD update -------------------------------------------------------------------

SGDS = [dict(lr=0.1, momentum=0.9, weight_decay=5e-4), dict(lr=0.05, momentum=0.0, weight_decay=1e-3),
        dict(lr=0.02, momentum=0.5, dampening=0.1, weight_decay=0.0), dict(lr=0.3, momentum=0.9, weight_decay=0.0)]


def sgd_runs(objectives, nesterov=False, pack_update=None, sync_free=False, milestones=((2, 4), (3,), (), (1, 2))):
    """The pack (its models from :func:`models`) and the same runs alone, each with its own SGD
    and MultiStepLR."""
    alone = [copy.deepcopy(m) for m in models(len(objectives))]
    packed = pack(models(len(objectives)))

    def opt(model, i):
        kw = dict(SGDS[i], nesterov=nesterov and SGDS[i]["momentum"] > 0)
        if nesterov:
            kw.update(momentum=kw["momentum"] or 0.3, dampening=0.0, nesterov=True)
        return torch.optim.SGD(model.parameters(), **kw)

    def sched(o, i):
        return torch.optim.lr_scheduler.MultiStepLR(o, list(milestones[i]), gamma=0.5)

    opts = [opt(m, i) for i, m in enumerate(packed.models)]
    stepper = PackedStep(packed, objectives, opts, [sched(o, i) for i, o in enumerate(opts)],
                         sync_free=sync_free, pack_update=pack_update)
    own = [opt(m, i) for i, m in enumerate(alone)]
    return packed, stepper, alone, own, [sched(o, i) for i, o in enumerate(own)]


@pytest.mark.parametrize("nesterov", [False, True])
def test_pack_update_equals_separate_sgd_steps(float64_default, nesterov):
    objectives = [CrossEntropy(), CrossEntropy(), NaNAfter(3), CrossEntropy()]
    packed, stepper, alone, own, scheds = sgd_runs(objectives, nesterov, pack_update=True)
    assert isinstance(stepper.update, PackedSGD)
    sep_objectives = [CrossEntropy(), CrossEntropy(), NaNAfter(3), CrossEntropy()]
    dead = False
    for t, (x, y) in enumerate(data(4, 6)):
        out = stepper.step(x, y, t)
        for i in range(4):
            if i == 2 and dead:
                continue
            loss = sep_objectives[i](alone[i](x[i]), y[i])
            if not torch.isfinite(loss):   # train.py would stop here: the pack freezes the run
                assert i == 2 and stepper.divergences[2].step == t + 1
                dead = True
                continue
            own[i].zero_grad(set_to_none=True)
            loss.backward()
            own[i].step()
            scheds[i].step()
            close(out.losses[i], loss.detach(), f"step {t} run {i} loss")
        for i in range(4):
            for (k, p), q in zip(alone[i].named_parameters(), packed.models[i].parameters()):
                close(q.detach(), p.detach(), f"step {t} run {i} {k}")
                mine, want = own[i].state.get(p, {}), stepper.optimizers[i].state.get(q, {})
                if mine.get("momentum_buffer") is not None:   # frozen: kept exactly
                    close(want["momentum_buffer"], mine["momentum_buffer"], f"step {t} run {i} {k} momentum")
            assert stepper.optimizers[i].param_groups[0]["lr"] == own[i].param_groups[0]["lr"]
    assert dead and stepper.diverged == [False, False, True, False]


def test_pack_update_is_chosen_where_it_can_serve(float64_default):
    packed, stepper, *_ = sgd_runs([CrossEntropy()] * 4)
    assert stepper.update is None and "CPU default" in stepper.update_note   # CPU: per-run by default
    assert unsupported(packed, stepper.optimizers) == ""
    ppd = SquareAUCMinMax(pos_ratio=0.5)
    opts = list(stepper.optimizers)
    opts[1] = torch.optim.SGD(param_groups(packed.models[1], ppd), lr=0.1)
    assert "3 parameter groups" in unsupported(packed, opts)
    opts[1] = torch.optim.Adam(packed.models[1].parameters())
    assert "Adam" in unsupported(packed, opts)
    with pytest.raises(ValueError, match="pack_update=True but run 1"):
        PackedStep(packed, stepper.objectives, opts, [None] * 4, pack_update=True)
    assert PackedStep(packed, stepper.objectives, opts, [None] * 4).update is None


def test_pack_update_in_a_graph_needs_one_capture_whatever_the_milestones(float64_default):
    """ce and dense auc_lp runs, sync-free, replayed: equal to per-run optimizers stepped
    eagerly, with one capture (per-run optimizers would recapture at every lr change)."""
    def objectives():
        return [CrossEntropy(), capture_form(AUCLoss(epsilon=0.5), "cuda"), CrossEntropy(), CrossEntropy()]

    pa, eager, *_ = sgd_runs(objectives(), pack_update=False, sync_free=True)
    pb, st, *_ = sgd_runs(objectives(), pack_update=True, sync_free=True)
    graphed = replayed(st)
    with labels_checked():
        for t, (x, y) in enumerate(data(4, 7)):
            a, b = eager.step(x, y, t), graphed.step(x, y, t)
            close(b.losses, a.losses, f"step {t} losses")
            for k in pa.params:
                close(pb.params[k].detach(), pa.params[k].detach(), f"step {t} {k}")
    assert graphed.captures == 1 and graphed.host_steps == 0
    assert [o.param_groups[0]["lr"] for o in st.optimizers] == [o.param_groups[0]["lr"] for o in eager.optimizers]


# --- PPD-SG / PPD-AdaGrad -----------------------------------------------------------------------

PPD_SPECS = [("ppd_sg", 0.1, 0, False), ("ppd_adagrad", 0.05, 1, False), ("ppd_sg", 0.02, 2, False)]


def ppd_configs(compose_cfg):
    cfgs = configs(compose_cfg, PPD_SPECS)
    for c in cfgs:   # stages of 2, 6, 18 steps: ends after steps 2 and 8
        c.optimizer.T0, c.scheduler.milestones = 2, []
        c.objective.alpha_samples = 20   # two batches of 12
    return cfgs


def test_ppd_pack_replayed_from_a_graph_equals_separate_eager_runs(float64_default, compose_cfg):
    cfgs = ppd_configs(compose_cfg)
    alone = [Run(c, m, 0.6) for c, m in zip(cfgs, models(3))]
    packed = pack(models(3))
    runs = [Run(c, m, 0.6) for c, m in zip(cfgs, packed.models)]
    st = PackedStep(packed, [r.objective for r in runs], [r.optimizer for r in runs],
                    [r.scheduler for r in runs], sync_free=True)
    assert capturable(st) == ""
    graphed = replayed(st, warmup=1)
    with labels_checked():
        for t, (x, y) in enumerate(data(3, 10)):
            out = graphed.step(x, y, t)
            for i, (sep, pk) in enumerate(zip(alone, runs)):
                tag = f"step {t} run {i} ({PPD_SPECS[i][0]})"
                _, loss = sep.step(x[i], y[i], t)
                close(out.losses[i], loss, f"{tag} loss")
                for (k, p), q in zip(sep.model.named_parameters(), pk.model.parameters()):
                    close(q.detach(), p.detach(), f"{tag} {k}")
                for (k, p), q in zip(sep.objective.named_parameters(), pk.objective.parameters()):
                    close(q.detach(), p.detach(), f"{tag} objective {k}")
                so, po = sep.optimizer, pk.optimizer
                assert (po.stage, po.stage_step, po.stage_len) == (so.stage, so.stage_step, so.stage_len), tag
                assert [g["lr"] for g in po.param_groups] == [g["lr"] for g in so.param_groups], tag
                for p, q in zip(sep.model.parameters(), pk.model.parameters()):
                    for key in so.state[p]:
                        close(po.state[q][key], so.state[p][key], f"{tag} optimizer {key}")
    # eager: the warm-up step 0 and the two stage ends (steps 1 and 7); captured at steps 2 and 8
    # (the stage end's lr / 3 is a Python float in the captured kernels)
    assert graphed.host_steps == 2 and graphed.captures == 2
    for sep, pk in zip(alone, runs):
        a, b = sep.objective.pop_stats(), pk.objective.pop_stats()
        assert a.keys() == b.keys() and "ppd_alpha_reset" in a
        for k in a:
            assert abs(a[k] - b[k]) <= 1e-10 * max(1.0, abs(a[k])), k


def test_ppd_sync_free_pack_step_makes_no_host_sync(float64_default, compose_cfg):
    cfgs = ppd_configs(compose_cfg)
    packed = pack(models(3))
    runs = [Run(c, m, 0.6) for c, m in zip(cfgs, packed.models)]
    st = PackedStep(packed, [r.objective for r in runs], [r.optimizer for r in runs],
                    [r.scheduler for r in runs], sync_free=True)
    (x0, y0), (x1, y1), (x2, y2) = data(3, 3)
    with labels_checked():
        st.step(x0, y0, 0)   # builds the optimizer state, the ring, the device flags
        with NoHostSync():
            st.step(x1, y1, 1)   # ends stage 1: averaging, lr / 3, the alpha re-estimate
            st.step(x2, y2, 2)


def test_ppd_optimizer_clock_is_the_step_arithmetic():
    w = torch.nn.Parameter(torch.zeros(2))
    opt = PPDSG([w], lr=0.1, T0=2)
    ends = []
    for t in range(26):
        assert opt.needs_host(t) == (t + 1 in (2, 8, 26)), t
        w.grad = torch.ones(2)
        opt.step()
        ends.append(opt.stage_ended)
        fresh = PPDSG([torch.nn.Parameter(torch.zeros(2))], lr=0.1, T0=2)
        fresh.sync_clock(t + 1)
        assert (fresh.stage, fresh.stage_step, fresh.stage_len, fresh.stage_ended) == \
            (opt.stage, opt.stage_step, opt.stage_len, opt.stage_ended), t
    assert [t + 1 for t, e in enumerate(ends) if e] == [2, 8, 26]


# --- auc_lp in its capture-safe form ------------------------------------------------------------

def test_auc_lp_takes_its_capture_safe_form_on_cuda_only():
    masked = AUCLoss(epsilon=0.1)
    assert not masked.capturable
    assert capture_form(masked, "cpu") is masked and capture_form(masked, torch.device("cpu")) is masked
    dense = capture_form(masked, "cuda")   # a device type, not a device: no CUDA needed
    assert dense.capturable and dense.pair_layout == "dense" and dense.solver_options["capture_safe"]
    assert masked.pair_layout == "masked" and not masked.solver_options   # the original is untouched
    assert capture_form(dense, "cuda") is dense
    ce = CrossEntropy()
    assert capture_form(ce, "cuda") is ce
    unrolled = AUCLoss(backward="unrolled")   # the capture-safe solver refuses it: keep the form
    assert capture_form(unrolled, "cuda") is unrolled
    closed = capture_form(AUCLoss(method="closed_form"), "cuda")
    assert closed.capturable and closed.pair_layout == "dense"


def test_capture_safe_form_has_the_masked_loss_and_gradient():
    """The check of tests/test_auc_dense_pairs.py, on the form the launcher picks."""
    def loss_and_grad(fn, logits, y):
        x = logits.clone().requires_grad_()
        loss = fn(x, y)
        loss.backward()
        return loss.detach(), x.grad

    for seed in range(20):   # sizes, imbalance, epsilon, one-class batches (seeds 3, 4, 8, 9, ...)
        logits, y, eps = auc_batch(seed)
        masked = AUCLoss(epsilon=eps)
        (la, ga), (lb, gb) = (loss_and_grad(fn, logits, y) for fn in (masked, capture_form(masked, "cuda")))
        assert abs(float(la - lb)) <= 1e-10, f"seed {seed}"
        assert float((ga - gb).abs().max()) <= 1e-10, f"seed {seed}"


def test_captured_auc_lp_pack_equals_separate_masked_runs(float64_default, compose_cfg):
    specs = [("auc_lp", 0.1, 0, False), ("auc_lp", 0.01, 1, False), ("ce", 0.1, 2, False)]
    cfgs = configs(compose_cfg, specs)
    alone = [Run(c, m, 0.6) for c, m in zip(cfgs, models(3))]
    packed = pack(models(3))
    runs = [Run(c, m, 0.6) for c, m in zip(cfgs, packed.models)]
    st = PackedStep(packed, [capture_form(r.objective, "cuda") for r in runs], [r.optimizer for r in runs],
                    [r.scheduler for r in runs], sync_free=True, pack_update=True)
    assert capturable(st) == ""
    graphed = replayed(st)
    with labels_checked():
        for t, (x, y) in enumerate(data(3, 4)):
            out = graphed.step(x, y, t)
            for i, (sep, pk) in enumerate(zip(alone, runs)):
                _, loss = sep.step(x[i], y[i], t)
                close(out.losses[i], loss, f"step {t} run {i} loss")
                for (k, p), q in zip(sep.model.named_parameters(), pk.model.parameters()):
                    close(q.detach(), p.detach(), f"step {t} run {i} {k}")
    assert graphed.captures == 1   # the milestone at step 1 changed an lr, not the graph
    assert runs[0].optimizer.param_groups[0]["lr"] == alone[0].optimizer.param_groups[0]["lr"]


# --- the launcher -------------------------------------------------------------------------------

def test_launcher_on_cuda_terms_writes_the_same_metrics(compose_cfg, tmp_path, monkeypatch):
    """The launcher as it runs on CUDA (capture-safe auc_lp, pack-wide SGD), forced on the CPU:
    the runs' metrics are the configured form's with per-run optimizers (float32: to 1e-5), and
    results.json says what the pack used."""
    import functools

    import pandas as pd

    import lpmetrics.packed.launch as launch
    short = ["dataset=digits", "trainer.max_steps=6", "trainer.eval_every=3"]
    specs = {"ce": [], "auc": ["objective=auc_lp", "objective.epsilon=0.5"]}

    def jobs(tag):
        return [launch.Job(compose_cfg([*short, *o]), tmp_path / tag / k, name=k) for k, o in specs.items()]

    plain = dict(zip(specs, launch.train_packed(jobs("cpu"), sync_free=True)))
    monkeypatch.setattr(launch, "capture_form", lambda objective, device: capture_form(objective, "cuda"))
    monkeypatch.setattr(launch, "PackedStep", functools.partial(PackedStep, pack_update=True))
    cuda = dict(zip(specs, launch.train_packed(jobs("cuda"), sync_free=True)))
    for k in specs:
        assert plain[k]["packed"]["pack_update"] is False and cuda[k]["packed"]["pack_update"] is True
        assert cuda[k]["packed"]["capture_safe_objective"] is (k == "auc")
        a = pd.read_csv(tmp_path / "cpu" / k / "metrics.csv")
        b = pd.read_csv(tmp_path / "cuda" / k / "metrics.csv")
        cols = ["step", "lr", "train_loss", "val_auc", "test_auc"]
        pd.testing.assert_frame_equal(a[cols], b[cols], check_exact=False, rtol=1e-5, atol=1e-6)


def test_the_gpu_check_script_runs_on_the_cpu(tmp_path):
    """``python -m lpmetrics.packed.check_graph`` (for a GPU window) on the CPU with its stand-in graph:
    the replayed pack equals the same stepper run eagerly, bitwise."""
    from lpmetrics.packed.check_graph import main
    rows = main(["--device", "cpu", "--model", "mlp", "--n", "2", "--steps", "4",
                 "--objectives", "ce", "ppd_sg", "--out", str(tmp_path / "check.json")])
    assert [r["objective"] for r in rows] == ["ce", "ppd_sg"] and all("error" not in r for r in rows)
    assert rows[0]["pack_update"] and not rows[1]["pack_update"] and rows[1]["host_steps"] == 1
    assert all(r["loss_diff_vs_eager"] == 0.0 and r["param_diff_vs_eager"] == 0.0 for r in rows)


def test_a_runs_checkpoint_holds_its_own_rows_not_the_pack(float64_default, tmp_path):
    """torch.save of a view writes its whole storage: a packed run's model and momentum state
    must come out as copies, or each run's last.pt would hold all N runs."""
    _, stepper, *_ = sgd_runs([CrossEntropy()] * 4, pack_update=True)
    (x, y), = data(4, 1)
    stepper.step(x, y, 0)
    model, opt = stepper.packed.models[0], stepper.optimizers[0]   # momentum 0.9
    alone = MLP(2, SHAPE, hidden=[8])
    sizes = {}
    for name, state in (("packed", {"model": model.state_dict(), "optimizer": opt.state_dict()}),
                        ("alone", {"model": alone.state_dict(), "optimizer": torch.optim.SGD(
                            alone.parameters(), lr=0.1, momentum=0.9).state_dict()})):
        torch.save(state, tmp_path / f"{name}.pt")
        sizes[name] = (tmp_path / f"{name}.pt").stat().st_size
    n_params = sum(p.numel() for p in alone.parameters())
    assert sizes["packed"] < sizes["alone"] + 2 * 8 * n_params + 4096   # + its momentum, not 4x
    saved = opt.state_dict()["state"][0]["momentum_buffer"]
    assert saved.untyped_storage().nbytes() == saved.numel() * saved.element_size()
    assert torch.equal(model.state_dict()["1.weight"], model.get_parameter("1.weight").detach())
