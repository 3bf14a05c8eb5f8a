"""``forward="highs"`` calls HiGHS through scipy's bindings, not ``linprog``'s wrapper
(:func:`solver.backends.highs._highs_direct`): same options, so the same vertex, duals,
iteration count and status as ``scipy.optimize.linprog(method="highs")`` -- the oracle here --
on random sparse and dense LPs with and without equalities, and on infeasible and unbounded
ones."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.optimize import linprog

from lpmetrics.solver.backends import highs


def random_lp(seed, n=60, m=50, p=2, dense=False):
    g = np.random.default_rng(seed)
    A = sp.random(m, n, density=0.1, random_state=g, data_rvs=g.standard_normal, format="csr")
    A = sp.vstack([A, sp.identity(n)], format="csr")           # the box z <= 3: bounded
    z0 = g.uniform(0, 1, n)
    b = A @ z0 + np.concatenate([g.uniform(0, 1, m), np.full(n, 3.0) - z0])
    E = sp.random(p, n, density=0.3, random_state=g, format="csr") if p else None
    be = None if E is None else E @ z0
    if dense:
        A, E = A.toarray(), None if E is None else E.toarray()
    return g.standard_normal(n), A, b, E, be


@pytest.mark.skipif(highs._h is None, reason="scipy without its HiGHS bindings")
@pytest.mark.parametrize("seed", range(12))
def test_direct_call_equals_linprog(seed):
    c, A, b, E, be = random_lp(seed, p=seed % 3, dense=seed % 4 == 3)
    ref = linprog(c, A_ub=A, b_ub=b, A_eq=E, b_eq=be, bounds=(0, None), method="highs")
    res = highs._highs_direct(c, A, b, E, be, None)
    assert ref.status == res.status == 0
    np.testing.assert_allclose(res.x, ref.x, rtol=0, atol=1e-12)
    np.testing.assert_allclose(res.ineqlin.marginals, ref.ineqlin.marginals, rtol=0, atol=1e-12)
    if E is not None:
        np.testing.assert_allclose(res.eqlin.marginals, ref.eqlin.marginals, rtol=0, atol=1e-12)
    # linprog zeroes the basic columns' reduced costs, which HiGHS leaves at roundoff
    np.testing.assert_allclose(res.lower.marginals, ref.lower.marginals, rtol=0, atol=1e-9)
    assert res.nit == ref.nit


@pytest.mark.skipif(highs._h is None, reason="scipy without its HiGHS bindings")
def test_direct_call_statuses_equal_linprog():
    c, A, b, _, _ = random_lp(0)
    infeasible = (c, A, -np.ones_like(b), None, None)           # A z <= -1 with the box rows
    unbounded = (-np.ones(3), sp.csr_matrix(np.array([[1.0, -1.0, 0.0]])), np.ones(1), None,
                 None)
    for args in (infeasible, unbounded):
        ref = linprog(args[0], A_ub=args[1], b_ub=args[2], bounds=(0, None), method="highs")
        res = highs._highs_direct(*args, None)
        assert res.status == ref.status != 0
        if ref.status == 4:
            assert ("unbounded or infeasible" in ref.message.lower()) == \
                ("unbounded or infeasible" in res.message.lower())
