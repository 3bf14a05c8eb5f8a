"""The capture-safe form of the one-vs-all AUC LP (``objective=auc_ova_lp``): dense B x B pairs and
the capture-safe solver (fixed Newton counts), against the default masked layout with the
standard solver, HiGHS, the closed form and finite differences, in float64 on the CPU; no host
sync in forward and backward, and the same ops with the same shapes whatever the labels.
"""
from __future__ import annotations

import pytest
import torch
from scipy.optimize import linprog
from torch.utils._python_dispatch import TorchDispatchMode

from lpmetrics.models.mlp import MLP
from lpmetrics.objectives.auc_ova import AUCOneVsAllLoss
from lpmetrics.objectives.common import labels_checked
from lpmetrics.objectives.pairwise import ramp_lp
from lpmetrics.packed import PackedStep, pack, param_groups
from lpmetrics.solver import SolverOptions
from tests.helpers import assert_graph_replays_eager
from tests.test_auc_dense_pairs import NoHostSync
from tests.test_packed_pack_forward import together_equals_alone

F64 = torch.float64
TOL = 1e-10


def batch(seed: int):
    """``(logits [B, K], labels, K, eps)``: B from 2 to 96, K 3-5; every 7th seed one class only,
    every 5th a missing class, every 4th quantised logits (ties, margins at exactly 0), every
    6th a two-sample batch, every 9th saturated scores."""
    g = torch.Generator().manual_seed(seed)
    K = 3 + seed % 3
    B = 2 if seed % 6 == 0 else int(torch.randint(3, 97, (1,), generator=g))
    logits = torch.randn(B, K, generator=g, dtype=F64) * (1 + 2 * float(torch.rand(1, generator=g)))
    if seed % 4 == 0:
        logits = (logits * 2).round() / 2
    if seed % 9 == 0:
        logits = logits * 20
    labels = torch.randint(0, K, (B,), generator=g)
    if seed % 5 == 0:
        labels[labels == K - 1] = 0
    if seed % 7 == 0:
        labels[:] = seed % K
    return logits, labels, K, (0.1, 0.01, 0.001)[seed % 3]


def loss_and_grad(fn, logits, labels):
    x = logits.clone().requires_grad_()
    loss = fn(x, labels)
    loss.backward()
    return loss.detach(), x.grad, fn.pop_stats()


@pytest.mark.parametrize("reduction", ["pairs", "classes"])
@pytest.mark.parametrize("score", ["softmax", "logits"])
def test_capture_safe_form_equals_the_default_path(reduction, score):
    """Loss, gradient and the batch statistics equal the default objective's (masked pairs,
    standard solver) to 1e-10 over 60 random batches each."""
    for seed in range(60):
        logits, labels, K, eps = batch(seed)
        plain = AUCOneVsAllLoss(num_classes=K, epsilon=eps, score=score, reduction=reduction)
        safe = plain.capture_safe_form()
        assert safe is not plain and safe.capturable and not plain.capturable
        (la, ga, sa), (lb, gb, sb) = (loss_and_grad(fn, logits, labels) for fn in (plain, safe))
        assert abs(float(la - lb)) <= TOL, f"seed {seed}: loss {la} vs {lb}"
        assert float((ga - gb).abs().max()) <= TOL, f"seed {seed}: gradient"
        for key in ("degenerate_batches", "empty_batches", "lp_pairs", "lp_converged"):
            assert sa.get(key) == sb.get(key), f"seed {seed}: {key} {sa.get(key)} vs {sb.get(key)}"


def test_one_class_batch_is_a_zero_loss_with_zero_gradient():
    fn = AUCOneVsAllLoss(num_classes=3).capture_safe_form()
    logits = torch.randn(8, 3, dtype=F64, requires_grad=True)
    loss = fn(logits, torch.full((8,), 2))
    loss.backward()
    assert float(loss.detach()) == 0.0 and not logits.grad.any()
    stats = fn.pop_stats()
    assert stats == {"degenerate_batches": 1.0, "empty_batches": 1.0}


@pytest.mark.parametrize("seed", range(8))
def test_loss_equals_highs_and_the_closed_form(seed):
    """Oracles: the per-class pairs' LP solved by scipy's HiGHS, and its closed form
    ``z = relu(eps - d)`` (``loss = 1 - sum w clip(d / eps, 0, 1)``)."""
    logits, labels, K, eps = batch(100 + seed)
    k = min(K, labels.numel())
    labels[:k] = torch.arange(k)                       # every class present (room permitting)
    fn = AUCOneVsAllLoss(num_classes=K, epsilon=eps)
    loss = fn.capture_safe_form()(logits, labels)
    d, w, _ = fn.pairs(logits, labels)
    M = d.numel()
    ref = linprog(torch.ones(M).numpy(), A_ub=-torch.eye(M, dtype=F64).numpy(),
                  b_ub=(d - eps).numpy(), bounds=(0, None), method="highs")
    assert ref.status == 0
    z = torch.from_numpy(ref.x)
    highs = 1 - (w * torch.relu(eps - z) / eps).sum()
    closed = 1 - (w * (d / eps).clamp(0, 1)).sum()
    assert abs(float(loss) - float(highs)) <= 1e-8
    assert abs(float(loss) - float(closed)) <= TOL


@pytest.mark.parametrize("reduction", ["pairs", "classes"])
def test_gradcheck(reduction):
    """float64 finite differences of the capture-safe loss w.r.t. the logits (random scores:
    no margin within the finite-difference step of a kink at 0 or eps)."""
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(10, 3, generator=g, dtype=F64, requires_grad=True)
    labels = torch.tensor([0, 1, 2, 0, 1, 2, 0, 0, 1, 2])
    fn = AUCOneVsAllLoss(num_classes=3, epsilon=0.5, reduction=reduction).capture_safe_form()
    assert torch.autograd.gradcheck(lambda x: fn(x, labels), (logits,), eps=1e-6, atol=1e-8)


def test_coverage_of_the_fixed_counts():
    """What the fixed counts must cover: the standard path's Newton steps and eps reductions
    on the pairs LP, over 300 random batches in float64 and float32, against ``fixed_iters``
    and ``fixed_eps_stages``; every capture-safe solve converged (the flag it records on the
    device).  ``-s`` prints the measurement the module docstring of objectives/auc_ova.py
    quotes."""
    opts = SolverOptions()
    worst_iters = worst_steps = 0
    for seed in range(300):
        logits, labels, K, eps = batch(1000 + seed)
        if seed % 2:
            logits = logits.float()
        fn = AUCOneVsAllLoss(num_classes=K, epsilon=eps)
        pairs = fn.pairs(logits, labels)
        if pairs is None:
            continue
        _, sol = ramp_lp(pairs[0], eps)
        worst_iters = max(worst_iters, sol.stats["iterations"])
        worst_steps = max(worst_steps, sol.stats["eps_steps"])
        safe = fn.capture_safe_form()
        safe(logits, labels)
        assert safe.pop_stats()["lp_converged"] == 1.0, f"seed {seed}"
    print(f"\nstandard path over 300 batches: max Newton steps {worst_iters}, max eps reductions "
          f"{worst_steps}; fixed_iters {opts.fixed_iters}, fixed_eps_stages {opts.fixed_eps_stages}")
    assert worst_iters <= opts.fixed_iters and worst_steps <= opts.fixed_eps_stages - 1


def test_too_few_iterations_are_recorded_not_hidden():
    """A capture-safe form whose counts do not cover the solve says so in ``lp_converged``:
    a first penalty eps of 1 (x |c|_inf) is above this LP's exactness threshold, and one
    stage leaves no room to lower it."""
    logits, labels, K, eps = batch(11)
    fn = AUCOneVsAllLoss(num_classes=K, epsilon=eps,
                         solver={"eps": 1.0, "fixed_eps_stages": 1}).capture_safe_form()
    fn(logits, labels)
    assert fn.pop_stats()["lp_converged"] == 0.0


class OpTrace(TorchDispatchMode):
    """Every op of the forward and backward with the shapes of its tensor outputs."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        flat = out if isinstance(out, (tuple, list)) else (out,)
        self.ops.append((str(func), tuple(tuple(t.shape) for t in flat if isinstance(t, torch.Tensor))))
        return out


def op_trace(fn, logits, labels):
    x = logits.clone().requires_grad_()
    with labels_checked(), OpTrace() as trace:
        fn(x, labels).backward()
    return trace.ops


def no_sync_forward_backward(fn, logits, labels, monkeypatch):
    """Forward and backward under :class:`NoHostSync`, with the Python conversions that read a
    tensor (``item``, ``bool``, ``numpy``, ...) made to raise as well."""
    def sync(*_, **__):
        raise AssertionError("host read in the capture-safe loss")

    x = logits.clone().requires_grad_()
    fn(x, labels)   # lazy imports and caches outside the check
    for name in ("item", "tolist", "__bool__", "__float__", "__int__", "numpy"):
        monkeypatch.setattr(torch.Tensor, name, sync)
    with labels_checked(), NoHostSync():
        fn(x, labels).backward()
    monkeypatch.undo()
    assert x.grad is not None


def test_forward_and_backward_make_no_host_sync(monkeypatch):
    logits, labels, K, eps = batch(13)
    for reduction in ("pairs", "classes"):
        fn = AUCOneVsAllLoss(num_classes=K, epsilon=eps, reduction=reduction).capture_safe_form()
        no_sync_forward_backward(fn, logits, labels, monkeypatch)


def test_the_default_form_does_sync():   # so the check above can fail
    logits, labels, K, eps = batch(13)
    with labels_checked(), NoHostSync(), pytest.raises(AssertionError, match="host sync"):
        AUCOneVsAllLoss(num_classes=K, epsilon=eps, solver={"capture_safe": True})(logits, labels)


def test_ops_and_shapes_do_not_depend_on_the_labels():
    """One captured graph serves every batch: the same ops with the same shapes for labels
    with every class, a missing class and a single class."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(12, 4, generator=g, dtype=F64)
    fn = AUCOneVsAllLoss(num_classes=4, reduction="classes").capture_safe_form()
    traces = [op_trace(fn, logits, y) for y in (torch.arange(12) % 4, torch.arange(12) % 3,
                                                torch.full((12,), 1))]
    assert traces[0] == traces[1] == traces[2]


def test_capture_safe_form_is_none_where_the_solver_needs_the_host():
    assert AUCOneVsAllLoss(num_classes=3, backward="unrolled").capture_safe_form() is None
    assert AUCOneVsAllLoss(num_classes=3, solver={"forward": "highs"}).capture_safe_form() is None
    safe = AUCOneVsAllLoss(num_classes=3, pair_layout="dense", solver={"capture_safe": True})
    assert safe.capturable and safe.capture_safe_form() is safe
    closed = AUCOneVsAllLoss(num_classes=3, method="closed_form").capture_safe_form()
    assert closed.capturable and closed.pair_layout == "dense" and closed.solver_options == {}
    with pytest.raises(ValueError, match="pair_layout"):
        AUCOneVsAllLoss(num_classes=3, pair_layout="sparse")


@pytest.mark.parametrize("seed", range(3))
def test_pack_forward_equals_the_separate_calls(seed):
    """Runs of a pack solve their LPs as one batch (``PairwiseRampLP.pack_forward``), bit for
    bit their own calls, a one-class batch among them."""
    objs = [AUCOneVsAllLoss(num_classes=3, epsilon=eps, reduction=red).capture_safe_form().double()
            for eps, red in ((0.1, "pairs"), (0.01, "classes"), (0.01, "pairs"))]
    assert len({o.pack_key() for o in objs}) == 1
    g = torch.Generator().manual_seed(seed)
    data = [(torch.randn(10, 3, generator=g, dtype=F64), torch.randint(0, 3, (10,), generator=g))
            for _ in range(3)]
    data[1] = (data[1][0], torch.zeros(10, dtype=torch.long))
    together = together_equals_alone(objs, data)
    assert float(together[1].detach()) == 0.0


def test_packed_sync_free_step_makes_no_host_sync():
    torch.manual_seed(0)
    models = [MLP(3, [3, 4, 4], hidden=[8]) for _ in range(2)]
    packed = pack(models)
    objectives = [AUCOneVsAllLoss(num_classes=3, epsilon=0.1).capture_safe_form() for _ in range(2)]
    opts = [torch.optim.SGD(param_groups(m, o), lr=0.1, momentum=0.9)
            for m, o in zip(packed.models, objectives)]
    stepper = PackedStep(packed, objectives, opts, [None] * 2, sync_free=True)
    x, y = torch.randn(2, 12, 3, 4, 4), torch.randint(0, 3, (2, 12))
    y[1] = 0   # one run's batch has a single class
    with labels_checked():
        stepper.step(x, y, 0)   # builds the optimizer state and the device flags
        with NoHostSync():
            out = stepper.step(x, y, 1)
    assert out.losses.shape == (2,)


def test_the_config_has_a_capture_safe_form(compose_cfg):
    from hydra.utils import instantiate
    cfg = compose_cfg(["objective=auc_ova_lp"])
    fn = instantiate(cfg.objective, num_classes=3)
    assert not fn.capturable and fn.capture_safe_form().capturable
    cfg = compose_cfg(["objective=auc_ova_lp", "+objective.pair_layout=dense",
                       "+objective.solver.capture_safe=true"])
    assert instantiate(cfg.objective, num_classes=3).capturable


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_graph_capture_and_replay():
    """The capture-safe loss and its backward captured in a CUDA graph; a replay on new logits
    and labels equals the eager call."""
    fn = AUCOneVsAllLoss(num_classes=3, epsilon=0.01).capture_safe_form().cuda()
    assert_graph_replays_eager(fn, batch=32, classes=3)
