"""The host route for one small dense CPU LP with a ``vertex_guess`` (:mod:`solver.backends.host_guess`)
gives what the general route gives: every field of the
:class:`solver.LPSolution`, its statistics (but the time) and per-LP statistics, and every
gradient, bit for bit, on planted LPs and on the ratio losses' LPs; it is taken where it
should be (the general route's problem builder is never called) and left where it should be
(batched, float32, a guess that does not certify, bad input, other options).  The general
route itself is checked against HiGHS and finite differences in
``tests/test_solver_square_active.py``.
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pytest
import torch

import lpmetrics.solver.solve as solve_mod
from lpmetrics.objectives.ratio import (F1LPLoss, FBetaLPLoss, JaccardLPLoss, PrecisionAtRecallLPLoss,
                              phi_of_logits)
from lpmetrics.solver import LPInputError, solve_lp
from lpmetrics.solver.backends import host_guess
from tests.test_solver_square_active import planted_lp

f64 = torch.float64


def _spy_general(monkeypatch) -> list:
    """A list that gets one entry per general-route solve (a call of its problem builder)."""
    count, real = [], solve_mod.build_problem

    def spy(*args, **kwargs):
        count.append(1)
        return real(*args, **kwargs)
    monkeypatch.setattr(solve_mod, "build_problem", spy)
    return count


def _both(monkeypatch, make, calls=None, route=host_guess):
    """``make()`` (a solve, then its backward) on the host route (the module ``route``, switched
    by its ``ENABLED``) and on the general route; ``calls`` (a list) gets the number of
    general-route solves of the first."""
    out, count = {}, _spy_general(monkeypatch)
    for enabled in (True, False):
        monkeypatch.setattr(route, "ENABLED", enabled)
        count.clear()
        out[enabled] = make()
        if enabled and calls is not None:
            calls.append(len(count))
    monkeypatch.setattr(route, "ENABLED", True)
    return out[True], out[False]


def _same(a, b, where=""):
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape, where
        assert torch.equal(a, b), where
    elif isinstance(a, Mapping):
        assert list(a) == list(b), where
        for k in a:
            if k != "seconds":
                _same(a[k], b[k], f"{where}.{k}")
    else:
        assert a == b, where


def _compare(host, general):
    (sol_h, grads_h), (sol_g, grads_g) = host, general
    for name in ("z", "value", "dual", "active", "stats", "instance_stats", "dual_eq",
                 "dual_bounds", "active_bounds", "eps", "penalty_z"):
        _same(getattr(sol_h, name), getattr(sol_g, name), name)
    assert len(grads_h) == len(grads_g)
    for gh, gg in zip(grads_h, grads_g):
        _same(gh, gg, "grad")


@pytest.mark.parametrize("seed", range(30))
def test_planted_lps_equal_the_general_route(monkeypatch, seed):
    n = 4 + seed % 11
    c, A, b, E, be, z = planted_lp(seed, n=n, m=n + 2 + seed % 5, p=seed % 3, zeros=seed % 3)

    def make():
        data = [torch.tensor(a, dtype=f64, requires_grad=True) for a in (c, A, b, E, be)]
        eq = data[3:] if E.size else [None, None]
        sol = solve_lp(*data[:3], *eq, vertex_guess=torch.tensor(z, dtype=f64))
        w = torch.randn(n, generator=torch.Generator().manual_seed(seed), dtype=f64)
        (sol.value + (w * sol.z).sum() + sol.dual.sum()).backward()
        return sol, [t.grad for t in data if t.grad is not None]
    calls = []
    host, general = _both(monkeypatch, make, calls)
    assert calls == [0] and host[0].stats["active_factor"] == "dense_lu"
    assert len(host[1]) == (5 if E.size else 3)
    _compare(host, general)


LOSSES = [F1LPLoss(), F1LPLoss(phi="softmax_st", margin=0.5), FBetaLPLoss(beta=2.0),
          JaccardLPLoss(), PrecisionAtRecallLPLoss(alpha=0.6), F1LPLoss(bound="lower")]


@pytest.mark.parametrize("seed", range(24))
def test_ratio_losses_equal_the_general_route(monkeypatch, seed):
    loss_fn = LOSSES[seed % len(LOSSES)]
    n = (8, 32, 64, 128)[seed % 4]
    g = torch.Generator().manual_seed(seed)
    logits0 = torch.randn(n, 2, generator=g, dtype=f64) * 2
    labels = (torch.rand(n, generator=g) < 0.4).long()
    labels[0] = 1

    def make():
        logits = logits0.clone().requires_grad_(True)
        loss = loss_fn(logits, labels)
        loss.backward()
        return loss, [logits.grad]
    calls = []
    (lh, gh), (lg, gg) = _both(monkeypatch, make, calls)
    if not isinstance(loss_fn, PrecisionAtRecallLPLoss):   # (its recall row may refuse the guess)
        assert calls == [0], "the loss's LP took the general route"
    _same(lh, lg, "loss")
    _same(gh[0], gg[0], "grad")
    # and the same LP solution, whichever route it took
    phi = phi_of_logits(logits0).clamp(-1 + 1e-6, 1 - 1e-6)
    lp = loss_fn.build_lp(phi, (labels == 1).to(f64))
    if lp.c.dim() == 1:
        _compare(*_both(monkeypatch, lambda: (solve_lp(lp.c, lp.A, lp.b, lp.A_eq, lp.b_eq,
                                                       vertex_guess=lp.guess), [])))


def test_the_host_route_builds_no_batched_problem(monkeypatch):
    c, A, b, E, be, z = (torch.tensor(a, dtype=f64) for a in planted_lp(3, n=9, m=14, p=1))

    def fail(*args, **kwargs):
        raise AssertionError("the general route ran")
    monkeypatch.setattr(solve_mod, "build_problem", fail)
    sol = solve_lp(c, A, b, E, be, vertex_guess=z)
    assert torch.allclose(sol.z, z, atol=1e-12)
    with pytest.raises(AssertionError, match="general route"):   # no guess: the general route
        solve_lp(c, A, b, E, be)


def _calls_general(monkeypatch, *args, **kwargs):
    count = _spy_general(monkeypatch)
    sol = solve_lp(*args, **kwargs)
    return bool(count), sol


def test_what_the_host_route_leaves_to_the_general_route(monkeypatch):
    c, A, b, E, be, z = (torch.tensor(a, dtype=f64) for a in planted_lp(5, n=8, m=12, p=1))
    assert not _calls_general(monkeypatch, c, A, b, E, be, vertex_guess=z)[0]
    cases = {
        "batched c": ((torch.stack([c, c]), A, b, E, be), {"vertex_guess": z}),
        "float32": ((c.float(), A.float(), b.float(), E.float(), be.float()),
                    {"vertex_guess": z.float()}),
        "wrong guess": ((c, A, b, E, be), {"vertex_guess": z + 0.3}),
        "non-finite guess": ((c, A, b, E, be), {"vertex_guess": z * float("nan")}),
        "highs": ((c, A, b, E, be), {"vertex_guess": z, "forward": "highs"}),
        "cg": ((c, A, b, E, be), {"vertex_guess": z, "linear_solver": "cg"}),
        "sparse A": ((c, A.to_sparse(), b, E, be), {"vertex_guess": z}),
    }
    for name, (args, kwargs) in cases.items():
        general, sol = _calls_general(monkeypatch, *args, **kwargs)
        assert general, name
        assert torch.allclose(sol.z.double(), z, atol=1e-4), name
    # unrolled backward: the general route too
    assert _calls_general(monkeypatch, c, A, b, E, be, vertex_guess=z, backward="unrolled")[0]


def test_bad_input_still_raises_the_typed_errors():
    c, A, b, E, be, z = (torch.tensor(a, dtype=f64) for a in planted_lp(7, n=6, m=9, p=1))
    bad = A.clone()
    bad[2, 3] = float("nan")
    with pytest.raises(LPInputError, match="A contains NaN"):
        solve_lp(c, bad, b, E, be, vertex_guess=z)
    with pytest.raises(LPInputError, match="columns"):
        solve_lp(c, A[:, :5], b, E, be, vertex_guess=z)
    with pytest.raises(LPInputError, match="both A_eq and b_eq"):
        solve_lp(c, A, b, E, None, vertex_guess=z)
    with pytest.raises(LPInputError, match="vertex_guess"):
        solve_lp(c, A, b, E, be, vertex_guess=z[:4])


def test_no_grad_and_constant_data(monkeypatch):
    c, A, b, E, be, z = (torch.tensor(a, dtype=f64) for a in planted_lp(11, n=7, m=10, p=0))
    host, general = _both(monkeypatch, lambda: (solve_lp(c, A, b, vertex_guess=z), []))
    _compare(host, general)
    assert not host[0].z.requires_grad
    with torch.no_grad():
        Ag = A.clone().requires_grad_(True)
        host, general = _both(monkeypatch, lambda: (solve_lp(c, Ag, b, vertex_guess=z), []))
    _compare(host, general)
    assert not host[0].z.requires_grad
    assert np.allclose(host[0].z.numpy(), z.numpy(), atol=1e-12)


def test_empty_inequality_or_equality_blocks(monkeypatch):
    """``A_eq`` with no rows, and ``A`` with no rows (equalities only): same as the general
    route, the empty block's gradient included."""
    c, A, b, _, _, z = planted_lp(3, n=7, m=10, p=0, zeros=2)
    g = np.random.default_rng(0)
    E, z2, c2 = g.standard_normal((5, 5)), g.uniform(0.5, 1.0, 5), g.standard_normal(5)
    cases = [((c, A, b), (np.zeros((0, 7)), np.zeros(0)), z),
             ((c2, np.zeros((0, 5)), np.zeros(0)), (E, E @ z2), z2)]
    for ineq, eq, guess in cases:
        def make():
            data = [torch.tensor(a, dtype=f64, requires_grad=True) for a in (*ineq, *eq)]
            sol = solve_lp(*data, vertex_guess=torch.tensor(guess, dtype=f64))
            (sol.z.sum() + sol.value).backward()
            return sol, [t.grad for t in data]
        calls = []
        host, general = _both(monkeypatch, make, calls)
        assert calls == [0]
        _compare(host, general)


def test_the_solution_pickles_and_stays_on_the_cpu(monkeypatch):
    """A host-route solution saves and copies like the general route's (its lazy per-LP
    statistics become the plain dict), and its tensors are on the CPU whatever torch's default
    device is."""
    import copy
    import pickle
    c, A, b, E, be, z = (torch.tensor(a, dtype=f64) for a in planted_lp(3, n=9, m=14, p=1))
    sol = solve_lp(c, A, b, E, be, vertex_guess=z)
    assert sol.stats["active_factor"] == "dense_lu"
    for back in (pickle.loads(pickle.dumps(sol)), copy.deepcopy(sol),
                 torch.load(_saved(sol), weights_only=False)):
        assert type(back.instance_stats) is dict
        _same(back.instance_stats, dict(sol.instance_stats))
    assert set(sol.instance_stats.copy()) == set(sol.instance_stats | {})
    monkeypatch.setattr(host_guess, "ENABLED", True)
    torch.set_default_device("meta")
    try:
        s2 = solve_lp(c, A, b, E, be, vertex_guess=z)
        tensors = [s2.z, s2.value, s2.dual, s2.eps, s2.penalty_z, *s2.instance_stats.values()]
    finally:
        torch.set_default_device("cpu")
    assert all(t.device.type == "cpu" for t in tensors)


def _saved(obj):
    import io
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return buf
