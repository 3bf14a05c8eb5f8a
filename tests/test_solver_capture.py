"""The capture-safe solver path (solver/capture/separable.py) against the standard path, HiGHS, gradcheck,
and checks that forward + backward never synchronise with the host (float64, CPU)."""
from __future__ import annotations

import pytest
import torch
from scipy.optimize import linprog
from torch.utils._python_dispatch import TorchDispatchMode

from lpmetrics.objectives.auc import AUCLoss, auc_pairs
from lpmetrics.objectives.auc_mu import AUCMuLoss
from lpmetrics.objectives.auc_ova import AUCOneVsAllLoss
from lpmetrics.objectives.pairwise import ramp_lp
from lpmetrics.solver import DiagonalOperator, LPInputError, LPSolverError, solve_lp

F64 = torch.float64
CAPTURE = {"capture_safe": True}


def family_batch(family: str, seed: int):
    """``(loss_fn, logits, labels)``: random scores; every 4th seed quantised scores (ties,
    margins at exactly 0 and near eps: degenerate vertices), every 5th a missing class."""
    g = torch.Generator().manual_seed(seed)
    B = 16 + 8 * (seed % 4)
    K = 2 if family == "binary" else 3
    logits = torch.randn(B, K, generator=g, dtype=F64)
    if seed % 4 == 0:
        logits = (logits * 4).round() / 4
    labels = torch.randint(0, K, (B,), generator=g)
    labels[:2] = torch.tensor([0, 1])
    if seed % 5 == 0 and K == 3:
        labels[labels == 2] = 1                    # class 2 missing from the batch
    eps = (0.1, 0.01, 0.001)[seed % 3]
    loss_fn = {"binary": lambda: AUCLoss(epsilon=eps),
               "ova": lambda: AUCOneVsAllLoss(num_classes=3, epsilon=eps),
               "mu": lambda: AUCMuLoss(num_classes=3, epsilon=eps)}[family]()
    return loss_fn, logits.requires_grad_(True), labels


def ramp_loss(d, w, eps, options):
    z, sol = ramp_lp(d, eps, options=options)
    return z, sol, 1.0 - (w * torch.relu(eps - z) / eps).sum()


@pytest.mark.parametrize("family", ["binary", "ova", "mu"])
def test_equal_to_standard_path(family):
    """z, objective value, loss and gradient wrt the scores equal the standard path's (1e-10)
    over 24 seeds; both converge (the capture-safe flag is a device tensor)."""
    for seed in range(24):
        loss_fn, logits, labels = family_batch(family, seed)
        d, w, *_ = loss_fn.pairs(logits, labels)
        out = []
        for options in ({}, CAPTURE):
            z, sol, loss = ramp_loss(d, w, loss_fn.epsilon, options)
            grad, = torch.autograd.grad(loss, logits, retain_graph=True)
            out.append((z, sol, loss, grad))
        (z0, s0, l0, g0), (z1, s1, l1, g1) = out
        assert isinstance(s1.stats["converged"], torch.Tensor) and bool(s1.stats["converged"])
        assert s0.stats["converged"]
        torch.testing.assert_close(z1, z0, atol=1e-10, rtol=0)
        torch.testing.assert_close(s1.value, s0.value, atol=1e-10, rtol=0)
        torch.testing.assert_close(l1, l0, atol=1e-10, rtol=0)
        torch.testing.assert_close(g1, g0, atol=1e-10, rtol=0)
        assert int(s1.stats["iterations"]) == s0.stats["iterations"]


def test_objectives_take_the_option_and_keep_stats_on_the_device():
    """``solver={"capture_safe": True}`` reaches the solver; the loss and its gradient equal the
    default objective's; solver diagnostics are summed on the device and read by pop_stats."""
    for family in ("binary", "ova", "mu"):
        loss_fn, logits, labels = family_batch(family, 7)
        cls, kw = type(loss_fn), {"epsilon": loss_fn.epsilon}
        if family != "binary":
            kw["num_classes"] = 3
        plain, safe = cls(**kw), cls(**kw, solver=CAPTURE)
        (g0,), (g1,) = (torch.autograd.grad(fn(logits, labels), logits) for fn in (plain, safe))
        torch.testing.assert_close(g1, g0, atol=1e-10, rtol=0)
        assert safe._stat_device["lp_iterations"].device == logits.device
        s0, s1 = plain.pop_stats(), safe.pop_stats()
        for key in ("lp_iterations", "lp_kkt_residual", "lp_active", "lp_converged"):
            assert s1[key] == pytest.approx(s0[key], abs=1e-6), key
        assert all(float(acc.sum()) == 0.0 for acc in safe._stat_device.values())   # popped: reset in place
        one_class = torch.zeros_like(labels)            # degenerate: nothing to rank
        loss = safe(logits, one_class)
        assert float(loss.detach()) == 0.0 and not torch.autograd.grad(loss, logits)[0].any()


def test_batched_and_degenerate_lps():
    """A batch of LPs (the B > 1 Newton path) with degenerate rows: all margins at exactly eps
    (b = 0: row and bound both tight), all equal, all far inside, plus random ones."""
    g = torch.Generator().manual_seed(3)
    eps = 0.01
    d = torch.rand(6, 40, generator=g, dtype=F64)
    d[0] = eps
    d[1] = 0.5
    d[2] = -3.0
    d[3, ::2] = eps
    d.requires_grad_(True)
    c, A = torch.ones_like(d), DiagonalOperator(-torch.ones(40, dtype=F64))
    sols = [solve_lp(c, A, d - eps, **o) for o in ({}, CAPTURE)]
    grads = [torch.autograd.grad((s.z * torch.arange(40.0, dtype=F64)).sum(), d)[0] for s in sols]
    torch.testing.assert_close(sols[1].z, sols[0].z, atol=1e-10, rtol=0)
    torch.testing.assert_close(sols[1].z, torch.relu(eps - d.detach()), atol=1e-10, rtol=0)
    torch.testing.assert_close(grads[1], grads[0], atol=1e-10, rtol=0)
    assert sols[1].instance_stats["converged"].all()
    assert torch.equal(sols[1].active, sols[0].active)


def test_extra_iterations_and_stages_leave_the_result_unchanged():
    """Masking: once an LP has stopped, further Newton steps and eps stages do not touch it."""
    g = torch.Generator().manual_seed(5)
    d = torch.randn(4, 300, generator=g, dtype=F64)
    c, A = torch.ones_like(d), DiagonalOperator(-torch.ones(300, dtype=F64))
    a = solve_lp(c, A, d - 0.01, **CAPTURE)
    b = solve_lp(c, A, d - 0.01, **CAPTURE, fixed_iters=40, fixed_eps_stages=5)
    for name in ("z", "value", "dual", "penalty_z", "eps"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert torch.equal(a.instance_stats["iterations"], b.instance_stats["iterations"])


def test_too_few_iterations_is_flagged_not_raised():
    g = torch.Generator().manual_seed(1)
    d = torch.randn(1000, generator=g, dtype=F64)
    c, A = torch.ones_like(d), DiagonalOperator(-torch.ones_like(d))
    # eps = 1 (x |c|_inf) is above this LP's exactness threshold: one stage cannot pass
    with pytest.raises(LPSolverError):
        solve_lp(c, A, d - 0.01, eps=1.0, max_eps_steps=0)
    sol = solve_lp(c, A, d - 0.01, **CAPTURE, eps=1.0, fixed_eps_stages=1)
    assert not bool(sol.stats["converged"]) and bool(sol.stats["finite_input"])
    nan = solve_lp(c, A, d - torch.nan, **CAPTURE)
    assert not bool(nan.stats["finite_input"])


def test_rejects_what_needs_the_host():
    d = torch.randn(10, dtype=F64)
    with pytest.raises(LPInputError, match="separable"):
        solve_lp(torch.ones(3, dtype=F64), torch.eye(3, dtype=F64), torch.ones(3, dtype=F64),
                 **CAPTURE)
    for bad in ({"vertex_guess": d}, {"step": "exact"}, {"warm_start": d}):
        with pytest.raises(LPInputError, match="capture_safe"):
            solve_lp(torch.ones_like(d), DiagonalOperator(-torch.ones_like(d)), d, **CAPTURE, **bad)
    with pytest.raises(LPInputError, match="fixed_iters"):
        solve_lp(torch.ones_like(d), DiagonalOperator(-torch.ones_like(d)), d, **CAPTURE,
                 fixed_iters=0)


@pytest.mark.parametrize("seed", range(6))
def test_objective_equals_highs(seed):
    """Oracle: the optimal value equals scipy's HiGHS to 1e-8."""
    g = torch.Generator().manual_seed(100 + seed)
    s = torch.rand(30, generator=g, dtype=F64)
    y = (torch.rand(30, generator=g) < 0.4).long()
    y[:2] = torch.tensor([0, 1])
    d, eps = auc_pairs(s, y), 0.05
    sol = solve_lp(torch.ones_like(d), DiagonalOperator(-torch.ones_like(d)), d - eps, **CAPTURE)
    M = d.numel()
    ref = linprog(torch.ones(M).numpy(), A_ub=-torch.eye(M, dtype=F64).numpy(),
                  b_ub=(d - eps).numpy(), bounds=(0, None), method="highs")
    assert ref.status == 0
    assert abs(float(sol.value) - ref.fun) <= 1e-8 * max(1.0, abs(ref.fun))


def test_gradcheck_wrt_b_and_a():
    """float64 gradcheck of z* wrt b and wrt the diagonal of A (margins away from the kinks)."""
    g = torch.Generator().manual_seed(0)
    b = torch.rand(12, generator=g, dtype=F64) - 0.5
    b = torch.where(b.abs() < 0.05, b + 0.1, b).requires_grad_(True)
    a = (-(0.5 + torch.rand(12, generator=g, dtype=F64))).requires_grad_(True)

    def z_of(b, a):
        return solve_lp(torch.ones_like(b), DiagonalOperator(a), b, **CAPTURE).z

    assert torch.autograd.gradcheck(z_of, (b, a), eps=1e-6, atol=1e-8)


class NoHostSync(TorchDispatchMode):
    """Fails on every op that hands a tensor's value to Python (``.item()``, ``bool()``,
    ``float()``, ``torch.equal``, data-dependent shapes)."""

    SYNCS = {"aten::_local_scalar_dense", "aten::is_nonzero", "aten::item", "aten::equal",
             "aten::nonzero", "aten::masked_select", "aten::unique", "aten::_unique2"}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func._schema.name in self.SYNCS:
            raise AssertionError(f"host sync: {func}")
        return func(*args, **(kwargs or {}))


def _fwd_bwd(d, iters=2, stages=2):
    """(small counts: the traced graph grows with them, the code it runs does not)"""
    sol = solve_lp(torch.ones_like(d), DiagonalOperator(-torch.ones(d.shape[-1], dtype=d.dtype)),
                   d - 0.01, capture_safe=True, fixed_iters=iters, fixed_eps_stages=stages)
    return sol.z, sol.stats["converged"], sol.stats["kkt_residual"]


def test_the_dispatch_mode_catches_syncs():
    d = torch.randn(2, 50, dtype=F64, requires_grad=True)
    with NoHostSync(), pytest.raises(AssertionError, match="host sync"):
        solve_lp(torch.ones_like(d), DiagonalOperator(-torch.ones(50, dtype=F64)), d - 0.01)


@pytest.mark.parametrize("shape", [(200,), (3, 50)])
def test_no_host_sync_in_forward_and_backward(shape):
    d = torch.randn(*shape, dtype=F64, requires_grad=True)
    with NoHostSync():
        z, conv, _ = _fwd_bwd(d)
        (z * z).sum().backward()
    assert d.grad is not None and bool(conv)


def test_fullgraph_compile():
    """dynamo traces the forward in one graph (it raises on ``.item()``, ``bool(tensor)`` or a
    data-dependent branch); aot_eager also traces the backward (one stage of one step: ~5 s
    instead of ~10 s); both equal eager."""
    d = torch.randn(3, 40, dtype=F64)
    for backend, counts in (("eager", (2, 2)), ("aot_eager", (1, 1))):
        torch._dynamo.reset()
        z_ref = _fwd_bwd(d, *counts)[0]
        dd = d.clone().requires_grad_(True)
        fn = torch.compile(lambda x: _fwd_bwd(x, *counts), backend=backend, fullgraph=True)
        z, conv, kkt = fn(dd)
        z.sum().backward()
        torch.testing.assert_close(z, z_ref, atol=1e-12, rtol=0)
        assert dd.grad is not None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_graph_capture_and_replay():
    d = torch.randn(64 * 64, device="cuda", dtype=torch.float32, requires_grad=True)
    fn = lambda: _fwd_bwd(d)[0].sum().backward()      # noqa: E731
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            d.grad = None
            fn()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    d.grad = None
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.isfinite(d.grad).all()


def test_config_override_reaches_the_objective(compose_cfg):
    """``+objective.solver.capture_safe=true`` (the key the auc_lp yaml documents)."""
    from hydra.utils import instantiate
    cfg = compose_cfg(["objective=auc_lp", "+objective.solver.capture_safe=true"])
    assert instantiate(cfg.objective).solver_options == {"capture_safe": True}
