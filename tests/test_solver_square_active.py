"""The host LU of a small dense LP's square active system (:mod:`solver.backends.square_active`):
a certified ``vertex_guess`` of a dense CPU LP is snapped, its multipliers and
its backward taken from one LAPACK LU of ``M = [A_T; A_eq; -I_Z]``.

Oracles: HiGHS (vertex, value and marginals) on random LPs with a planted nondegenerate optimum,
``gradcheck`` (finite differences) in float64 for ``A, b, A_eq, b_eq`` (unbatched, batched, an
``A`` shared by a batch), and the F1 loss's gradient by finite differences.  A degenerate
vertex (more tight rows than ``n``) and an ill-conditioned ``M`` keep the least-squares path.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.optimize import linprog

from lpmetrics.solver import solve_lp
from lpmetrics.solver.backends import square_active
from lpmetrics.solver.recover import GUESS_TIGHT

f64 = torch.float64


def planted_lp(seed, n=8, m=12, p=1, zeros=3):
    """A random dense LP whose unique optimum ``z*`` is known and nondegenerate: ``zeros``
    bounds and ``n - zeros - p`` rows of ``A`` active with positive multipliers, every other
    row strictly slack.  Returns numpy ``(c, A, b, A_eq, b_eq, z*)``."""
    g = np.random.default_rng(seed)
    A = g.standard_normal((m, n))
    E = g.standard_normal((p, n))
    z = g.uniform(0.5, 2.0, n)
    Z = g.choice(n, zeros, replace=False)
    z[Z] = 0.0
    T = g.choice(m, n - zeros - p, replace=False)
    b = A @ z + g.uniform(0.5, 1.5, m)
    b[T] = A[T] @ z
    uA, uz, uE = np.zeros(m), np.zeros(n), g.standard_normal(p)
    uA[T], uz[Z] = g.uniform(0.5, 2.0, T.size), g.uniform(0.5, 2.0, Z.size)
    c = -(A.T @ uA + E.T @ uE - uz)                  # stationarity with u >= 0
    return c, A, b, E, E @ z, z


def highs(c, A, b, E, be):
    res = linprog(c, A_ub=A, b_ub=b, A_eq=E, b_eq=be, bounds=(0, None), method="highs")
    assert res.status == 0
    return res


def tensors(*arrays):
    return [torch.tensor(a, dtype=f64) for a in arrays]


@pytest.mark.parametrize("seed", range(40))
def test_certified_guess_equals_highs(seed):
    n = 4 + seed % 9
    c, A, b, E, be, z_star = planted_lp(seed, n=n, m=n + 2 + seed % 7, p=seed % 3,
                                        zeros=seed % 3)
    res = highs(c, A, b, E if E.size else None, be if be.size else None)
    cT, AT, bT, ET, beT, zT = tensors(c, A, b, E, be, z_star)
    eq = (ET, beT) if E.size else (None, None)
    sol = solve_lp(cT, AT, bT, *eq, vertex_guess=zT)
    assert sol.stats["active_factor"] == "dense_lu" and sol.stats["iterations"] == 0
    scale = 1 + np.abs(res.x).max()
    assert np.abs(sol.z.numpy() - res.x).max() <= 1e-8 * scale
    assert abs(float(sol.value) - res.fun) <= 1e-9 * (1 + abs(res.fun))
    # HiGHS's marginals are d obj / d b: -u for A z <= b
    assert np.abs(sol.dual.numpy() + res.ineqlin.marginals).max() <= 1e-7 * (1 + np.abs(c).max())
    if E.size:
        assert np.abs(sol.dual_eq.numpy() + res.eqlin.marginals).max() <= 1e-7 * (1 + np.abs(c).max())
    assert sol.stats["kkt_residual"] <= 1e-8


def _exact_guess(c, A, b, E, be):
    """The optimum of the LP at these (perturbed) data, to roundoff: HiGHS's active set, one
    dense solve on it (a guess that follows the data, so every gradcheck evaluation certifies
    it on the fast path)."""
    args = [t.detach().numpy() for t in (c, A, b, E, be)]
    res = highs(*args)
    An, bn, En, ben = args[1:]
    rows = np.flatnonzero(np.abs(An @ res.x - bn) <= 1e-7)
    bnds = np.flatnonzero(res.x <= 1e-9)
    M = np.vstack([An[rows], En, -np.eye(len(res.x))[bnds]])
    h = np.concatenate([bn[rows], ben, np.zeros(bnds.size)])
    return torch.tensor(np.linalg.solve(M, h), dtype=f64)


@pytest.mark.parametrize("seed", range(6))
def test_gradcheck_of_the_square_path(seed):
    c, A, b, E, be, _ = tensors(*planted_lp(100 + seed, n=6, m=9, p=1, zeros=2))
    w = torch.randn(6, dtype=f64, generator=torch.Generator().manual_seed(seed))

    def f(A, b, E, be):
        guess = _exact_guess(c, A, b, E, be)
        sol = solve_lp(c, A, b, E, be, vertex_guess=guess)
        assert sol.stats["active_factor"] == "dense_lu"
        return (sol.z * w).sum()

    data = [t.clone().requires_grad_(True) for t in (A, b, E, be)]
    assert torch.autograd.gradcheck(f, data, eps=1e-6, atol=1e-7, rtol=1e-6)


def test_gradcheck_batched_and_shared_A():
    lps = [tensors(*planted_lp(200 + i, n=5, m=8, p=1, zeros=1)) for i in range(2)]
    c = torch.stack([lp[0] for lp in lps])
    b = torch.stack([lp[2] for lp in lps])
    E = torch.stack([lp[3] for lp in lps])
    be = torch.stack([lp[4] for lp in lps])
    A = torch.stack([lp[1] for lp in lps])
    w = torch.randn(2, 5, dtype=f64, generator=torch.Generator().manual_seed(0))

    def batched(A, b, E, be):
        guess = torch.stack([_exact_guess(c[i], A[i], b[i], E[i], be[i]) for i in range(2)])
        sol = solve_lp(c, A, b, E, be, vertex_guess=guess)
        assert sol.stats["active_factor"] == "dense_lu"
        return (sol.z * w).sum()

    data = [t.clone().requires_grad_(True) for t in (A, b, E, be)]
    assert torch.autograd.gradcheck(batched, data, eps=1e-6, atol=1e-7, rtol=1e-6)

    # one A for two costs (the ratio losses' bound="mid"): the gradient sums over the batch
    c1, A1, b1, E1, be1, _ = lps[0]
    cs = torch.stack([c1, c1 + 0.01 * torch.randn(5, dtype=f64,
                                                  generator=torch.Generator().manual_seed(1))])

    def shared(A1, b1):
        guess = torch.stack([_exact_guess(ci, A1, b1, E1, be1) for ci in cs])
        sol = solve_lp(cs, A1, b1, E1, be1, vertex_guess=guess)
        assert sol.stats["active_factor"] == "dense_lu"
        return (sol.z * w).sum()

    assert torch.autograd.gradcheck(shared, [A1.clone().requires_grad_(True),
                                             b1.clone().requires_grad_(True)],
                                    eps=1e-6, atol=1e-7, rtol=1e-6)


def test_degenerate_vertex_keeps_the_least_squares_path():
    c, A, b, E, be, z = planted_lp(7, n=6, m=9, p=1, zeros=2)
    i = np.flatnonzero(np.abs(A @ z - b) <= 1e-12)[0]    # an active row, duplicated
    A, b = np.vstack([A, A[i:i + 1]]), np.concatenate([b, b[i:i + 1]])
    res = highs(c, A, b, E, be)
    cT, AT, bT, ET, beT, zT = tensors(c, A, b, E, be, z)
    sol = solve_lp(cT, AT, bT, ET, beT, vertex_guess=zT)
    assert sol.stats["active_factor"] != "dense_lu"
    assert np.abs(sol.z.numpy() - res.x).max() <= 1e-8 * (1 + np.abs(res.x).max())


def test_ill_conditioned_system_is_refused():
    """``cond(M)`` above ``1e4`` (the Cholesky path's ``cond(K_T) <= 1e8``): no host LU, the
    torch path certifies the guess instead (and still solves the LP)."""
    c, A, b, E, be, z = tensors(*planted_lp(3, n=5, m=8, p=1, zeros=1))
    from lpmetrics.solver.problem import build_problem
    assert square_active.recover(build_problem(c, A, b, E, be), z[None], 1e-8, GUESS_TIGHT) is not None
    active = (A @ z - b).abs() <= 1e-12
    scale = torch.where(active, 1e6, 1.0)            # the active rows: cond(M) ~ 1e6
    prob = build_problem(c, A * scale[:, None], b * scale, E, be)
    assert square_active.recover(prob, z[None], 1e-8, GUESS_TIGHT) is None
    sol = solve_lp(c, A * scale[:, None], b * scale, E, be, vertex_guess=z)
    assert sol.stats["active_factor"] != "dense_lu"
    assert (sol.z - z).abs().max() <= 1e-8


@pytest.mark.parametrize("seed", range(3))
def test_f1_loss_gradient_by_finite_differences(seed):
    from lpmetrics.objectives.ratio import F1LPLoss
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(24, 2, generator=g, dtype=f64).requires_grad_(True)
    labels = (torch.rand(24, generator=g) < 0.5).long()
    labels[0] = 1
    loss_fn = F1LPLoss()
    assert torch.autograd.gradcheck(lambda x: loss_fn(x, labels), [logits], eps=1e-7,
                                    atol=1e-6, rtol=1e-5)
    loss_fn(logits, labels)
    assert loss_fn.pop_stats()["lp_iterations"] == 0      # the guess certified, no Newton


def test_a_non_finite_guess_is_skipped():
    """A guess with a NaN or inf entry (the ratio losses' closed form where a denominator
    vanishes on the box vertex) is not certified: the eps loop solves the LP, which matches
    HiGHS."""
    c, A, b, E, be, z = planted_lp(5, n=6, m=9, p=1, zeros=2)
    res = highs(c, A, b, E, be)
    cT, AT, bT, ET, beT, zT = tensors(c, A, b, E, be, z)
    for bad in (float("nan"), float("inf")):
        guess = zT.clone()
        guess[0] = bad
        sol = solve_lp(cT, AT, bT, ET, beT, vertex_guess=guess)
        assert sol.stats["iterations"] > 0 and sol.stats["converged"]
        assert np.abs(sol.z.numpy() - res.x).max() <= 1e-8 * (1 + np.abs(res.x).max())


def test_box_vertex_with_a_vanishing_denominator_warns_nothing():
    """numpy's division warnings stay out of a training log: the non-finite guess is the
    defined outcome there (skipped by the solver, previous test)."""
    import warnings as _w
    from lpmetrics.objectives.fractional import box_vertex
    num = torch.tensor([1.0, -1.0, 0.5], dtype=f64)
    den = torch.tensor([1.0, 1.0, 1.0], dtype=f64)
    phi = torch.zeros(3, dtype=f64)
    with _w.catch_warnings():
        _w.simplefilter("error", RuntimeWarning)
        x = box_vertex(num, den, 0.0, 1.0, phi,
                       bounds=(torch.zeros(3, dtype=f64), torch.zeros(3, dtype=f64)))
    assert not torch.isfinite(x).all()
