"""``objective.pair_layout=dense`` for the binary AUC LP: all B x B pairs with
zero weight off the (positive, negative) ones, a fixed shape, no host sync.

Against the default masked layout (the oracle here is the masked layout, itself tested against
HiGHS and the closed form in ``tests/test_auc.py``): loss and gradient agree to 1e-10 in float64
over 40 random batches (sizes, imbalance, epsilon, solver paths), including one-class batches;
the degenerate-batch and pair-count diagnostics agree; with ``solver.capture_safe`` the loss,
its backward and a packed sync-free step make no host sync.
"""
from __future__ import annotations

import pytest
import torch

from lpmetrics.models.mlp import MLP
from lpmetrics.objectives.auc import AUCLoss
from lpmetrics.objectives.common import labels_checked
from lpmetrics.packed import PackedStep, pack, param_groups
from tests.test_solver_capture import NoHostSync as _NoHostSync


class NoHostSync(_NoHostSync):
    """Also fails on boolean-mask indexing (``x[mask]``: its output shape is the mask's count,
    read on the host), which the CPU kernel does without a separate ``nonzero`` op."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func._schema.name in ("aten::index", "aten::index_put", "aten::index_put_") and any(
                isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (args[1] or [])):
            raise AssertionError(f"host sync: boolean-mask {func}")
        return super().__torch_dispatch__(func, types, args, kwargs)

TOL = 1e-10


def batch(seed: int):
    g = torch.Generator().manual_seed(seed)
    b = int(torch.randint(2, 40, (1,), generator=g))
    kind = seed % 5
    p = {0: 0.9, 1: 0.5, 2: 0.1, 3: 1.0, 4: 0.0}[kind]     # 3, 4: one-class batches
    y = (torch.rand(b, generator=g) < p).long()
    logits = torch.randn(b, 2, generator=g, dtype=torch.float64) * 2
    eps = [0.5, 0.1, 0.01, 1.0][seed % 4]
    return logits, y, eps


def loss_and_grad(layout: str, logits, y, eps, **kw):
    x = logits.clone().requires_grad_()
    fn = AUCLoss(epsilon=eps, pair_layout=layout, **kw)
    loss = fn(x, y)
    loss.backward()
    return loss.detach(), x.grad, fn


@pytest.mark.parametrize("kw", [{}, {"solver": {"capture_safe": True}}, {"method": "closed_form"},
                                {"score": "margin"}], ids=["lp", "capture_safe", "closed_form", "margin"])
def test_dense_layout_equals_masked_layout(kw):
    for seed in range(40):
        logits, y, eps = batch(seed)
        (la, ga, fa), (lb, gb, fb) = (loss_and_grad(lay, logits, y, eps, **kw) for lay in ("masked", "dense"))
        assert abs(float(la - lb)) <= TOL, f"seed {seed}: loss {la} vs {lb}"
        assert float((ga - gb).abs().max()) <= TOL, f"seed {seed}: gradient"
        sa, sb = fa.pop_stats(), fb.pop_stats()
        for key in ("degenerate_batches", "empty_batches", "lp_pairs"):
            assert sa.get(key) == sb.get(key), f"seed {seed}: {key} {sa.get(key)} vs {sb.get(key)}"


def test_one_class_batch_is_a_zero_loss_with_zero_gradient():
    logits = torch.randn(8, 2, dtype=torch.float64, requires_grad=True)
    fn = AUCLoss(pair_layout="dense", solver={"capture_safe": True})
    loss = fn(logits, torch.ones(8, dtype=torch.long))
    loss.backward()
    assert float(loss.detach()) == 0.0 and torch.equal(logits.grad, torch.zeros_like(logits))
    stats = fn.pop_stats()
    assert stats["degenerate_batches"] == 1.0 and stats["empty_batches"] == 1.0
    assert "lp_pairs" not in stats and "lp_iterations" not in stats   # as the masked layout


def test_statistics_average_over_the_batches_that_had_pairs():
    fa, fb = AUCLoss(pair_layout="masked"), AUCLoss(pair_layout="dense")
    for seed in range(10):
        logits, y, _ = batch(seed)
        fa(logits, y), fb(logits, y)
    a, b = fa.pop_stats(), fb.pop_stats()
    assert a["degenerate_batches"] == b["degenerate_batches"] >= 0.4   # seeds 3, 8 (all +), 4, 9 (all -), ...
    assert a["lp_pairs"] == pytest.approx(b["lp_pairs"], abs=1e-12)


def test_bad_layout_is_named():
    with pytest.raises(ValueError, match="pair_layout"):
        AUCLoss(pair_layout="sparse")


def test_the_masked_layout_does_sync():   # so the check below can fail
    logits, y, eps = batch(1)
    with labels_checked(), NoHostSync(), pytest.raises(AssertionError, match="host sync"):
        AUCLoss(epsilon=eps, solver={"capture_safe": True})(logits, y)


def test_dense_capture_safe_loss_and_backward_make_no_host_sync():
    logits, y, eps = batch(1)
    x = logits.clone().requires_grad_()
    fn = AUCLoss(epsilon=eps, pair_layout="dense", solver={"capture_safe": True})
    fn(x, y)   # a first call outside the check (lazy imports, buffers)
    with labels_checked(), NoHostSync():
        loss = fn(x, y)
        loss.backward()


def test_packed_sync_free_step_with_dense_auc_lp_makes_no_host_sync():
    torch.manual_seed(0)
    models = [MLP(2, [3, 4, 4], hidden=[8]) for _ in range(3)]
    packed = pack(models)
    objectives = [AUCLoss(epsilon=0.1, pair_layout="dense", solver={"capture_safe": True}) for _ in range(3)]
    opts = [torch.optim.SGD(param_groups(m, o), lr=0.1, momentum=0.9) for m, o in zip(packed.models, objectives)]
    stepper = PackedStep(packed, objectives, opts, [None] * 3, sync_free=True)
    x, y = torch.randn(3, 16, 3, 4, 4), (torch.rand(3, 16) < 0.7).long()
    y[2] = 1   # one run's batch has no negatives
    with labels_checked():
        stepper.step(x, y, 0)   # builds the optimizer state and the device flags
        with NoHostSync():
            out = stepper.step(x, y, 1)
    assert out.losses.shape == (3,)


def test_the_capture_safe_twin_records_on_the_device_it_is_moved_to():
    """``capture_safe_form`` tries the twin on a CPU batch; the pack then trains it on CUDA. Its
    popped CPU accumulators must give way (the bug the first H100 window hit: every auc_lp pack
    failed with "recorded on cpu and now on cuda:0"); unread statistics still refuse the move.
    The meta device stands in for CUDA (no host copy is needed to add there)."""
    twin = AUCLoss(method="lp", epsilon=0.01).capture_safe_form()
    assert twin is not None and twin.pair_layout == "dense"
    twin.record(degenerate_batches=torch.zeros((), device="meta"))   # no error: the CPU trial was popped
    assert twin._stat_device["degenerate_batches"].device.type == "meta"
    other = AUCLoss(method="lp", epsilon=0.01)
    other.record(lp_pairs=torch.ones(()))
    with pytest.raises(RuntimeError, match="call pop_stats"):
        other.record(lp_pairs=torch.ones((), device="meta"))
    other.pop_stats()
    other.record(lp_pairs=torch.ones((), device="meta"))
