"""The sync-free packed step: the eager step's numbers without a host sync.

float64 on the CPU: the sync-free step gives the eager step's losses, logits, gradients,
parameters, BatchNorm statistics and objective diagnostics bit for bit over a pack that mixes
objectives (``ce``, ``auc_lp``, ``f1_lp``, ``ppd_sg``) with a degenerate batch; a run whose loss
or scores turn non-finite is found by :meth:`PackedStep.poll` at the right step with its reason
and leaves the others bit-identical; the launcher's sync-free mode writes the eager mode's
metrics. A test that counts host syncs checks the step makes none (``ce`` + SGD).
"""
from __future__ import annotations

import copy

import pandas as pd
import pytest
import torch

from lpmetrics.models.mlp import MLP
from lpmetrics.models.resnet import resnet18
from lpmetrics.objectives.common import check_labels, labels_checked
from lpmetrics.packed import PackedStep, pack
from lpmetrics.packed.launch import Job, train_packed
from tests.test_packed import (FLAT, IMAGE, MIXED, NaNAfter, Run, batches, build, configs, run_pack,
                               sgd_stepper, small_cnn)


def stepper_of(compose_cfg, make_model, specs, sync_free):
    cfgs = configs(compose_cfg, specs)
    packed = pack(build(make_model, specs))
    runs = [Run(c, m, 0.6) for c, m in zip(cfgs, packed.models)]
    return packed, runs, PackedStep(packed, [r.objective for r in runs], [r.optimizer for r in runs],
                                    [r.scheduler for r in runs], sync_free=sync_free)


@pytest.mark.parametrize("make", [lambda: MLP(2, FLAT, hidden=[32, 16]), small_cnn,
                                  pytest.param(lambda: resnet18(2, IMAGE), marks=pytest.mark.slow)],
                         ids=["mlp", "conv_bn", "resnet18"])
def test_sync_free_step_equals_the_eager_step_bitwise(float64_default, compose_cfg, make):
    shape = FLAT if make().__class__ is MLP else IMAGE
    specs = MIXED + [("ce", 0.01, 5, True)]
    eager = stepper_of(compose_cfg, make, specs, sync_free=False)
    free = stepper_of(compose_cfg, make, specs, sync_free=True)
    for t, (x, y) in enumerate(batches(specs, shape, batch=8, steps=3)):
        a, b = eager[2].step(x, y, t), free[2].step(x, y, t)
        assert torch.equal(a.losses, b.losses), f"step {t}: {a.losses} vs {b.losses}"
        assert torch.equal(a.logits, b.logits)
        for i, (ra, rb) in enumerate(zip(eager[1], free[1])):
            for (k, p), q in zip(ra.model.named_parameters(), rb.model.parameters()):
                assert torch.equal(p.grad, q.grad) and torch.equal(p, q), f"step {t} run {i} {k}"
            for (k, p), q in zip(ra.model.named_buffers(), rb.model.buffers()):
                assert torch.equal(p, q), f"step {t} run {i} buffer {k}"
            for p, q in zip(ra.objective.parameters(), rb.objective.parameters()):
                assert torch.equal(p, q)
    assert free[2].poll() == [] and not free[2].divergences
    for ra, rb in zip(eager[1], free[1]):
        assert ra.objective.pop_stats() == rb.objective.pop_stats()


def sync_free_pack(models, objectives, data, lrs=(0.1, 0.05, 0.02)):
    packed, stepper = sgd_stepper([copy.deepcopy(m) for m in models], objectives, lrs)
    stepper.sync_free = True
    losses = [stepper.step(x, y, step=t).losses for t, (x, y) in enumerate(data)]
    return packed, stepper, losses


def test_sync_free_finds_a_nonfinite_loss_at_its_step_and_leaves_the_others(float64_default):
    torch.manual_seed(0)
    models = [MLP(2, FLAT, hidden=[16]) for _ in range(3)]
    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(3, 8, *FLAT, generator=g), torch.tensor([[0, 1] * 4] * 3)) for _ in range(4)]
    healthy, _, healthy_losses = sync_free_pack(models, [NaNAfter(10**9) for _ in range(3)], data)
    sick, stepper, losses = sync_free_pack(models, [NaNAfter(10**9), NaNAfter(1), NaNAfter(10**9)], data)
    assert not stepper.divergences                 # nothing read yet
    assert stepper.poll() == [1] and stepper.poll() == []
    assert stepper.divergences[1].step == 2 and stepper.divergences[1].reason == "loss is nan"
    assert torch.isfinite(losses[0]).all() and all(torch.isnan(v[1]) for v in losses[1:])
    for t in range(4):
        assert torch.equal(losses[t][[0, 2]], healthy_losses[t][[0, 2]])
    for i in (0, 2):
        for (k, a), b in zip(healthy.models[i].state_dict().items(), sick.models[i].state_dict().values()):
            assert torch.equal(a, b), f"run {i} {k} changed by run 1's NaN"
    more = (torch.randn(3, 8, *FLAT, generator=g), torch.tensor([[0, 1] * 4] * 3))
    frozen = {k: v.clone() for k, v in sick.models[1].state_dict().items()}
    assert torch.isnan(stepper.step(*more, step=4).losses[1])    # polled: frozen from now on
    for k, v in sick.models[1].state_dict().items():
        assert torch.equal(v.nan_to_num(), frozen[k].nan_to_num()), k


def test_sync_free_names_nonfinite_scores_and_feeds_the_objective_zeros(float64_default):
    torch.manual_seed(0)
    models = [small_cnn() for _ in range(3)]
    with torch.no_grad():
        models[2][0].weight[0, 0, 0, 0] = float("nan")
    seen = []

    class Spy(NaNAfter):
        def forward(self, logits, labels):
            seen.append(bool(torch.isfinite(logits).all()))
            return super().forward(logits, labels)

    data = [(torch.randn(3, 4, *IMAGE), torch.tensor([[0, 1, 1, 0]] * 3)) for _ in range(2)]
    _, stepper, losses = sync_free_pack(models, [Spy(10**9) for _ in range(3)], data)
    assert all(seen), "an objective saw non-finite scores"
    assert stepper.poll() == [2]
    _, eager, _ = run_pack(models, [NaNAfter(10**9) for _ in range(3)], data)
    assert stepper.divergences == eager.divergences   # same step, same words (and count)
    assert "scores are non-finite" in stepper.divergences[2].reason
    assert torch.isnan(losses[0][2]) and torch.isfinite(losses[1][:2]).all()


def test_labels_checked_skips_only_the_range_check():
    logits = torch.zeros(3, 2)
    with pytest.raises(ValueError, match="0..1"):
        check_labels(logits, torch.tensor([0, 1, 2]))
    with labels_checked():
        assert check_labels(logits, torch.tensor([0, 1, 2])).tolist() == [0, 1, 2]
        with pytest.raises(ValueError, match="integer"):
            check_labels(logits, torch.tensor([0.0, 1.0, 1.0]))
    with pytest.raises(ValueError, match="0..1"):
        check_labels(logits, torch.tensor([0, 1, 2]))


def test_launcher_sync_free_writes_the_eager_metrics(compose_cfg, tmp_path):
    short = ["dataset=digits", "trainer.max_steps=6", "trainer.eval_every=3"]
    specs = {"ce": [], "auc": ["objective=auc_lp"], "ppd": ["objective=ppd_sg", "optimizer=ppd_sg"],
             "nan": ["objective._target_=tests.test_train.ExplodingLoss", "~objective.label_smoothing"]}
    out = {}
    for mode in (False, True):
        jobs = [Job(compose_cfg([*short, *o]), tmp_path / f"{mode}" / k, name=k) for k, o in specs.items()]
        out[mode] = dict(zip(specs, train_packed(jobs, sync_free=mode)))
    for k in specs:
        a, b = out[False][k], out[True][k]
        assert a["diverged"] == ({"step": 1, "reason": "loss is nan"} if k == "nan" else None)
        if k == "nan":
            assert b["diverged"] == a["diverged"]
            continue
        assert b["diverged"] is None and b["packed"]["sync_free"] is True
        ma = pd.read_csv(tmp_path / "False" / k / "metrics.csv")
        mb = pd.read_csv(tmp_path / "True" / k / "metrics.csv")
        pd.testing.assert_frame_equal(ma, mb, check_exact=True)


def test_sync_free_ce_step_makes_no_host_sync(monkeypatch):
    """``ce`` + SGD: no ``.item()`` / ``bool(tensor)`` / ``tolist()`` in the step (each would be
    a device sync on CUDA), counted by making them raise."""
    torch.manual_seed(0)
    models = [MLP(2, FLAT, hidden=[8]) for _ in range(2)]
    _, stepper = sgd_stepper(models, [NaNAfter(10**9) for _ in range(2)], (0.1, 0.01))
    stepper.sync_free = True
    x, y = torch.randn(2, 4, *FLAT), torch.tensor([[0, 1, 1, 0]] * 2)
    stepper.step(x, y, 0)   # first step builds the device flags

    def sync(*_, **__):
        raise AssertionError("host sync in the sync-free step")

    for name in ("item", "tolist", "__bool__", "__float__", "__int__"):
        monkeypatch.setattr(torch.Tensor, name, sync)
    with labels_checked():
        stepper.step(x, y, 1)
    monkeypatch.undo()
    assert stepper.poll() == []
