"""Packed runs: one packed step equals N separate train.py steps.

float64 on the CPU: logits, losses, gradients (model and objective parameters), BatchNorm
running statistics and updated parameters agree to 1e-10 (relative to max(1, |value|)) over a
pack that mixes objectives (ce, auc_lp, f1_lp, ppd_sg), learning rates, schedules and seeds, with
a degenerate (one-class) batch; a non-finite run is frozen and leaves the others bit-identical;
pack -> unpack round-trips bitwise. Both forward modes (``vmap``, the GPU's; ``loop``, the CPU's)
are checked; the loop mode equals separate float32 runs bitwise. Objectives and optimizers come from the project's configs
(Hydra compose), built as train.py builds them.
"""
from __future__ import annotations

import copy

import pytest
import torch
from hydra.utils import instantiate

from lpmetrics.run.builders import instantiate_runtime
from lpmetrics.models.mlp import MLP
from lpmetrics.models.resnet import resnet18
from lpmetrics.objectives.base import Objective
from lpmetrics.packed import PackedStep, PackError, pack, param_groups, unpack

TOL = 1e-10
IMAGE = [3, 32, 32]
FLAT = [3, 8, 8]

# (objective, lr, seed, degenerate first batch); ppd_sg runs with T0=1 so its first step ends a
# stage (averaging, lr / 3, the alpha reset that calls model(x) in eval mode)
MIXED = [("ce", 0.1, 0, False), ("auc_lp", 0.01, 1, True), ("f1_lp", 0.01, 2, False),
         ("ppd_sg", 0.1, 3, False)]


def small_cnn(num_classes: int = 2, input_shape=IMAGE) -> torch.nn.Module:
    """The layer kinds of ResNet-18 (bias-free convolutions, BatchNorm with running statistics, a
    strided convolution, global pooling, a linear head) at a size the fast suite can afford in
    float64; the ResNet-18 versions of the same checks are ``slow`` (~40-60 s each here)."""
    nn = torch.nn
    return nn.Sequential(nn.Conv2d(input_shape[0], 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.Conv2d(8, 8, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, num_classes))


def close(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    scale = max(1.0, float(b.abs().max())) if b.numel() else 1.0
    err = float((a - b).abs().max()) if b.numel() else 0.0
    assert err <= TOL * scale, f"{what}: max |packed - separate| = {err:.3g} (scale {scale:.3g})"


class Run:
    """One run's components built as train.py builds them, around ``model``."""

    def __init__(self, cfg, model: torch.nn.Module, pos_ratio: float) -> None:
        runtime = {"num_classes": 2, "input_shape": [], "pos_ratio": pos_ratio,
                   "class_counts": [40, 60]}
        self.model, self.cfg = model, cfg
        self.objective = instantiate_runtime(cfg.objective, **runtime)
        self.optimizer = instantiate(cfg.optimizer, _partial_=True)(
            params=param_groups(model, self.objective))
        self.scheduler = torch.optim.lr_scheduler.MultiStepLR(
            self.optimizer, milestones=list(cfg.scheduler.milestones), gamma=cfg.scheduler.gamma)

    def step(self, x, y, step: int):
        """train.py's step, verbatim in its calls."""
        logits = self.model(x)
        loss = self.objective(logits, y)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self.cfg.trainer.max_grad_norm:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.trainer.max_grad_norm)
        self.optimizer.step()
        self.scheduler.step()
        self.objective.on_step_end(step=step, model=self.model, optimizer=self.optimizer,
                                   batch=(x, y))
        return logits.detach(), loss.detach()


def configs(compose_cfg, specs, clip=None):
    out = []
    for j, (name, lr, _, _) in enumerate(specs):
        over = [f"objective={name}", f"optimizer.lr={lr}", "scheduler.milestones=[1]"]
        if name == "ppd_sg":
            over += ["optimizer.T0=1", "scheduler.milestones=[]"]
        if name == "auc_lp":
            over += ["objective.epsilon=0.5"]   # a wide ramp: most pairs carry gradient
        if clip is not None and j == clip:
            over += ["trainer.max_grad_norm=0.05"]
        out.append(compose_cfg(over))
    return out


def build(make_model, specs):
    models = []
    for _, _, seed, _ in specs:
        torch.manual_seed(seed)
        models.append(make_model())
    return models


def batches(specs, shape, batch: int, steps: int):
    g = torch.Generator().manual_seed(123)
    out = []
    for t in range(steps):
        x = torch.randn(len(specs), batch, *shape, generator=g)
        y = (torch.rand(len(specs), batch, generator=g) < 0.6).long()
        y[:, :2] = torch.tensor([0, 1])
        for i, (_, _, _, degenerate) in enumerate(specs):
            if degenerate and t == 0:
                y[i] = 1   # one class only: the AUC LP has no pair (zero loss, zero gradient)
        out.append((x, y))
    return out


def check_pack_equals_separate(compose_cfg, make_model, specs, shape, batch, steps, clip=None,
                               mode="vmap"):
    cfgs = configs(compose_cfg, specs, clip)
    models = build(make_model, specs)
    separate = [Run(c, copy.deepcopy(m), 0.6) for c, m in zip(cfgs, models)]
    packed = pack(models, mode)
    packed_runs = [Run(c, m, 0.6) for c, m in zip(cfgs, packed.models)]
    stepper = PackedStep(packed, [r.objective for r in packed_runs],
                         [r.optimizer for r in packed_runs], [r.scheduler for r in packed_runs],
                         [c.trainer.max_grad_norm for c in cfgs])
    packed.train()
    for t, (x, y) in enumerate(batches(specs, shape, batch, steps)):
        out = stepper.step(x, y, step=t)
        assert not stepper.divergences
        for i, (sep, pk) in enumerate(zip(separate, packed_runs)):
            tag = f"step {t} run {i} ({specs[i][0]})"
            logits, loss = sep.step(x[i], y[i], t)
            close(out.logits[i], logits, f"{tag} logits")
            close(out.losses[i], loss, f"{tag} loss")
            for (name, p), q in zip(sep.model.named_parameters(), pk.model.parameters()):
                close(q.grad, p.grad, f"{tag} grad {name}")
                close(q.detach(), p.detach(), f"{tag} param {name}")
            for (name, b), c in zip(sep.model.named_buffers(), pk.model.buffers()):
                close(c.double(), b.double(), f"{tag} buffer {name}")
            for (name, p), q in zip(sep.objective.named_parameters(), pk.objective.parameters()):
                close(q.grad, p.grad, f"{tag} objective grad {name}")
                close(q.detach(), p.detach(), f"{tag} objective param {name}")
            assert pk.optimizer.param_groups[0]["lr"] == sep.optimizer.param_groups[0]["lr"]
    stacked = unpack(packed)
    for i, sep in enumerate(separate):   # the storage holds what each model holds alone
        for name, value in sep.model.state_dict().items():
            close(stacked[i][name].double(), value.double(), f"unpacked run {i} {name}")
    for i, (sep, pk) in enumerate(zip(separate, packed_runs)):   # diagnostics, e.g. degenerate
        stats, want = pk.objective.pop_stats(), sep.objective.pop_stats()
        assert stats.keys() == want.keys()
        for k in want:
            assert abs(stats[k] - want[k]) <= TOL * max(1.0, abs(want[k])), f"run {i} stat {k}"
        if specs[i][3] and specs[i][0] == "auc_lp":   # CE has no notion of a degenerate batch
            assert stats["degenerate_batches"] == 1 / steps


@pytest.mark.parametrize("mode", ["vmap", "loop"])
def test_conv_bn_pack_step_equals_separate_steps(float64_default, compose_cfg, mode):
    check_pack_equals_separate(compose_cfg, small_cnn, MIXED, IMAGE, batch=8, steps=2, mode=mode)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["vmap", "loop"])
def test_resnet18_pack_step_equals_separate_steps(float64_default, compose_cfg, mode):
    check_pack_equals_separate(compose_cfg, lambda: resnet18(2, IMAGE), MIXED, IMAGE, batch=8,
                               steps=2, mode=mode)


@pytest.mark.parametrize("mode", ["vmap", "loop"])
def test_mlp_pack_step_equals_separate_steps(float64_default, compose_cfg, mode):
    specs = MIXED + [("auc_lp", 0.1, 4, False), ("ce", 0.001, 5, True)]
    check_pack_equals_separate(compose_cfg, lambda: MLP(2, FLAT, hidden=[32, 16]), specs, FLAT,
                               batch=16, steps=3, clip=0, mode=mode)


def test_loop_mode_equals_separate_runs_bitwise(compose_cfg):
    """float32: the loop mode runs each model's own kernels, so nothing differs at all."""
    specs = [("ce", 0.1, 0, False), ("auc_lp", 0.01, 1, False)]
    cfgs = configs(compose_cfg, specs)
    models = build(lambda: resnet18(2, IMAGE), specs)
    separate = [Run(c, copy.deepcopy(m), 0.6) for c, m in zip(cfgs, models)]
    packed = pack(models, "loop")
    runs = [Run(c, m, 0.6) for c, m in zip(cfgs, packed.models)]
    stepper = PackedStep(packed, [r.objective for r in runs], [r.optimizer for r in runs],
                         [r.scheduler for r in runs])
    packed.train()
    for t, (x, y) in enumerate(batches(specs, IMAGE, 8, 2)):
        out = stepper.step(x, y, t)
        for i, sep in enumerate(separate):
            logits, loss = sep.step(x[i], y[i], t)
            assert torch.equal(out.logits[i], logits) and torch.equal(out.losses[i], loss)
    for i, sep in enumerate(separate):
        for (k, v), w in zip(sep.model.state_dict().items(), unpack(packed)[i].values()):
            assert torch.equal(v, w), f"run {i} {k}"


class NaNAfter(Objective):
    """Cross-entropy that turns NaN at ``step`` (finite logits, non-finite loss)."""

    def __init__(self, step: int) -> None:
        super().__init__()
        self.calls, self.at = 0, step

    def forward(self, logits, labels):
        self.calls += 1
        loss = torch.nn.functional.cross_entropy(logits, labels)
        return loss * float("nan") if self.calls > self.at else loss


def sgd_stepper(models, objectives, lrs, mode="vmap"):
    packed = pack(models, mode)
    opts = [torch.optim.SGD(param_groups(m, o), lr=lr, momentum=0.9, weight_decay=5e-4)
            for m, o, lr in zip(packed.models, objectives, lrs)]
    return packed, PackedStep(packed, objectives, opts, [None] * len(models))


def run_pack(models, objectives, data, lrs=(0.1, 0.05, 0.02), mode="vmap"):
    packed, stepper = sgd_stepper([copy.deepcopy(m) for m in models], objectives, lrs, mode)
    losses = [stepper.step(x, y, step=t).losses for t, (x, y) in enumerate(data)]
    return packed, stepper, losses


@pytest.mark.parametrize("mode", ["vmap", "loop"])
def test_nonfinite_scores_freeze_one_run_and_leave_the_others_bit_identical(float64_default, mode):
    torch.manual_seed(0)
    models = [small_cnn() for _ in range(3)]
    poisoned = copy.deepcopy(models)
    with torch.no_grad():
        poisoned[1][0].weight[0, 0, 0, 0] = float("nan")
    before = {k: v.clone() for k, v in poisoned[1].state_dict().items()}
    data = [(torch.randn(3, 4, *IMAGE), torch.tensor([[0, 1, 1, 0]] * 3)) for _ in range(2)]
    ce = lambda: [NaNAfter(10**9) for _ in range(3)]   # noqa: E731 -- plain CE
    healthy, _, healthy_losses = run_pack(models, ce(), data, mode=mode)
    sick, stepper, sick_losses = run_pack(poisoned, ce(), data, mode=mode)
    assert stepper.diverged == [False, True, False]
    assert stepper.divergences[1].step == 1 and "non-finite" in stepper.divergences[1].reason
    for t in range(2):
        assert torch.isnan(sick_losses[t][1])
        assert torch.equal(sick_losses[t][[0, 2]], healthy_losses[t][[0, 2]])
    for i in (0, 2):
        for (k, a), b in zip(healthy.models[i].state_dict().items(), sick.models[i].state_dict().values()):
            assert torch.equal(a, b), f"run {i} {k} changed by run 1's NaN"
    for k, v in sick.models[1].state_dict().items():   # frozen: params and BN statistics
        assert torch.equal(v.isnan(), before[k].isnan()), f"frozen run 1 {k} changed"
        assert torch.equal(v.nan_to_num(), before[k].nan_to_num()), f"frozen run 1 {k} changed"


def test_nonfinite_loss_freezes_the_run_at_that_step(float64_default):
    torch.manual_seed(0)
    models = [MLP(2, FLAT, hidden=[16]) for _ in range(3)]
    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(3, 8, *FLAT, generator=g), torch.tensor([[0, 1] * 4] * 3))
            for _ in range(3)]
    plain = [NaNAfter(10**9) for _ in range(3)]
    healthy, _, _ = run_pack(models, plain, data)
    sick, stepper, losses = run_pack(models, [NaNAfter(10**9), NaNAfter(1), NaNAfter(10**9)], data)
    assert stepper.diverged == [False, True, False]
    assert stepper.divergences[1].step == 2 and stepper.divergences[1].reason == "loss is nan"
    assert torch.isfinite(losses[0]).all() and torch.isnan(losses[2][1])
    after_one, _, _ = run_pack(models, [NaNAfter(10**9) for _ in range(3)], data[:1])
    for i in range(3):
        want = (after_one if i == 1 else healthy).models[i].state_dict()
        for k, v in sick.models[i].state_dict().items():
            assert torch.equal(v, want[k]), f"run {i} {k}"
    assert all(p.grad is None for p in sick.models[1].parameters())


@pytest.mark.parametrize("make", [lambda: resnet18(2, IMAGE), lambda: resnet18(3, [1, 16, 16], cifar_stem=True),
                                  lambda: MLP(2, FLAT, hidden=[8, 8])], ids=["resnet18", "cifar_stem", "mlp"])
def test_pack_unpack_round_trips_bitwise(make):
    models = []
    for seed in range(3):
        torch.manual_seed(seed)
        models.append(make())
        with torch.no_grad():   # non-trivial BatchNorm statistics
            for b in models[-1].buffers():
                b.add_(seed + 1)
    originals = [copy.deepcopy(m.state_dict()) for m in models]
    packed = pack(models)
    for state, original in zip(unpack(packed), originals):
        assert list(state) == list(original)
        for k in original:
            assert torch.equal(state[k], original[k]) and state[k].dtype == original[k].dtype, k
    for model, original in zip(models, originals):   # packing leaves the models untouched
        assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), original.values()))


def test_packed_models_alias_the_storage():
    torch.manual_seed(0)
    packed = pack([MLP(2, FLAT, hidden=[8]) for _ in range(2)])
    with torch.no_grad():
        packed.models[1].get_parameter("1.bias").add_(1.0)
    assert torch.equal(packed.params["1.bias"][1], packed.models[1].get_parameter("1.bias"))
    x = torch.randn(2, 5, *FLAT)
    packed.eval()
    assert torch.allclose(packed(x)[1], packed.models[1](x[1]), atol=1e-6)


def test_bad_packs_say_what_differs():
    with pytest.raises(PackError, match="model 1 key '1.weight'"):
        pack([MLP(2, FLAT, hidden=[8]), MLP(2, FLAT, hidden=[9])])
    with pytest.raises(PackError, match="model 1 is a ResNet"):
        pack([MLP(2, FLAT), resnet18(2, IMAGE)])
    with pytest.raises(PackError, match="dropout"):
        pack([MLP(2, FLAT, dropout=0.1)] * 2)
    with pytest.raises(PackError, match="empty"):
        pack([])
    packed = pack([MLP(2, FLAT, hidden=[8]) for _ in range(2)])
    with pytest.raises(ValueError, match=r"\[N=2, B, \.\.\.\]"):
        packed(torch.randn(3, 4, *FLAT))
    with pytest.raises(ValueError, match="one per run"):
        PackedStep(packed, [None], [None, None], [None, None])
