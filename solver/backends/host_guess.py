r"""One small dense float64 CPU LP with a ``vertex_guess``, certified end to end on the host.

:func:`solver.solve_lp`'s general route for a ``vertex_guess`` builds the batched problem
(:func:`solver.problem.build_problem`: checks, flattening, the scales ``c_hat``, ``h_scale`` as
torch ops), certifies the guess on the host (:func:`solver.backends.square_active.recover`) and assembles
the solution, its statistics and its per-LP statistics from torch tensors.  For one LP of the
size the ratio losses solve every step (:mod:`objectives.ratio`: ``n = batch + 1``, e.g. 65)
those ~60 torch dispatches cost more than the certificate itself (one LAPACK LU and a few
products).  :func:`solve` takes the same steps with the host arrays, in the same order and
with the same functions where there is arithmetic (:func:`solver.backends.square_active.certify`, the
KKT measures of :func:`solver.recover.kkt_terms`, the backward
:class:`solver.backends.square_active._SquareVertex`), so every field of its
:class:`solver.LPSolution` and every gradient equals the general route's
(``tests/test_solver_host_guess.py`` compares them field by field, to the bit).

It covers: ``c [n]``, ``A [m, n]``, ``b [m]`` (and ``A_eq [p, n]``, ``b_eq [p]``) dense float64
CPU tensors, ``n <= DENSE_LU_MAX_N``, a finite guess ``[n]`` or ``[1, n]``, the active-set
backward, ``forward`` "newton" or "auto", ``linear_solver`` "auto" or "cholesky", no
``compute_dtype`` other than float64.  Anything else, non-finite data, or a guess that does not
certify returns ``None``: the caller then takes the general route, which raises the typed
errors for bad input and solves what the guess does not, so no result depends on this path.
"""
from __future__ import annotations

import math
import time

import numpy as np
import torch

from lpmetrics.solver.operators import DenseOperator
from lpmetrics.solver.recover import GUESS_TIGHT
from lpmetrics.solver.solution import LazyStats, LPSolution
from lpmetrics.solver.backends.square_active import (DENSE_LU_MAX_N, HostLP, _SquareVertex, _host, certify,
                                  dense_factor)

# tests switch it off to compare with the general route
ENABLED = True
f64 = torch.float64


def _plain(t) -> bool:
    return (isinstance(t, torch.Tensor) and t.dtype == f64 and t.layout == torch.strided
            and t.device.type == "cpu")


def _shapes(c, A, b, A_eq, b_eq, x) -> tuple[int, int, int] | None:
    """``(n, m, p)`` where the data are in this module's scope (see the module docstring)."""
    if not all(_plain(t) for t in (c, A, b, x)) or c.dim() != 1 or A.dim() != 2 or b.dim() != 1:
        return None
    (n,), (m, cols) = c.shape, A.shape
    if cols != n or b.shape[0] != m or not 0 < n <= DENSE_LU_MAX_N or x.shape[-1] != n \
            or x.numel() != n or x.dim() > 2:
        return None
    p = 0
    if A_eq is not None:
        if not (_plain(A_eq) and _plain(b_eq) and A_eq.dim() == 2 and b_eq.dim() == 1
                and A_eq.shape[1] == n and b_eq.shape[0] == A_eq.shape[0]):
            return None
        p = A_eq.shape[0]
    return (n, m, p) if m + p else None


def solve(c, A, b, A_eq, b_eq, opts, backward: str, t0: float) -> LPSolution | None:
    """The :class:`solver.LPSolution` of ``solve_lp(c, A, b, A_eq, b_eq, backward=backward,
    **opts)`` when the call is in scope and ``opts.vertex_guess`` certifies; else ``None``."""
    x = opts.vertex_guess
    if (not ENABLED or backward != "active_set" or opts.forward == "highs"
            or opts.linear_solver not in ("auto", "cholesky")
            or opts.compute_dtype not in (None, f64) or not isinstance(x, torch.Tensor)
            or (A_eq is None) != (b_eq is None)):
        return None
    dims = _shapes(c, A, b, A_eq, b_eq, x)
    if dims is None:
        return None
    n, m, p = dims
    ch, Ah, bh, xh = _host(c), _host(A), _host(b), _host(x).reshape(1, n)
    Eh, beh = (_host(A_eq), _host(b_eq)) if p else (None, None)
    arrays = (ch, Ah, bh, xh) + ((Eh, beh) if p else ())
    # one sum per array: finite iff no entry is NaN/Inf (build_problem's test; the general
    # route names the culprit)
    if not all(math.isfinite(a.sum()) for a in arrays):
        return None
    hmax = max(np.abs(bh).max() if m else 0.0, np.abs(beh).max() if p else 0.0)
    lp = HostLP(ch[None], bh[None], None if not p else beh[None],
                np.array([1.0 + hmax]), np.array([np.abs(ch).max()]),
                lambda i: (Ah, Eh), lambda i, *data_and_sets: dense_factor(*data_and_sets))
    out = certify(lp, xh, 1e-8 if opts.tol is None else opts.tol, GUESS_TIGHT)
    if out is None:
        return None
    def ops():
        return DenseOperator(A), None if A_eq is None else DenseOperator(A_eq)
    # "cholesky": what solver.linsolve.choose_method picks for a small dense LP
    return certified_solution(c, (A, b, A_eq, b_eq), ops, out, "dense", iterations=0,
                              method="cholesky", forward="newton", penalty_z=x.reshape(n),
                              t0=t0)


def certified_solution(c, data, ops, out, kind: str, *, iterations: int, method: str,
                       forward: str, penalty_z: torch.Tensor, t0: float) -> LPSolution:
    """The fields :func:`solver.output.assemble` gives one certified vertex (``out``, from
    :func:`solver.backends.square_active.certify`; ``kind``: its factor, "dense" or "sparse") of the LP
    ``data = (A, b, A_eq, b_eq)`` (``A`` / ``A_eq``: the matrices' differentiable data as
    :class:`solver.backends.square_active._SquareVertex` reads them through the operators ``ops()``
    makes, or ``None`` where they are constant), with the statistics of a ``forward`` run of ``iterations`` steps and
    linear solver ``method``.  Shared by this module and :mod:`solver.backends.host_highs`."""
    t = torch.from_numpy
    A, b, A_eq, b_eq = data
    m, p = out.tA.shape[1], 0 if out.uE is None else out.uE.shape[1]
    system = out.system(kind)
    z = t(out.z[0])
    if torch.is_grad_enabled() and any(d is not None and d.requires_grad for d in data):
        z = _SquareVertex.apply(z, system, m, p, ops(), *data)
    primal_inf, dual_res, gap, _ = (float(v[0]) for v in out.measures)
    kkt, active = float(out.kkt[0]), float(out.tA.sum() + out.tz.sum())
    stats = {"iterations": iterations, "converged": True, "kkt_residual": kkt,
             "primal_infeasibility": primal_inf, "dual_residual": dual_res,
             "duality_gap": gap, "active_count": active, "eps": 0.0, "eps_steps": 0,
             "linear_solver": method, "active_factor": system.factor_kind,
             "forward": forward, "cg_iterations": 0, "batch_size": 1,
             "seconds": time.perf_counter() - t0, "equilibrated": False, "presolve": None}

    def per():                       # (on the CPU like the data, whatever the default device)
        def f(v, dtype=f64):
            return torch.tensor(v, dtype=dtype, device="cpu")
        return {"iterations": f(iterations, torch.long), "converged": f(True, torch.bool),
                "kkt_residual": f(kkt), "primal_infeasibility": f(primal_inf),
                "dual_residual": f(dual_res), "duality_gap": f(gap), "active_count": f(active),
                "eps": f(0.0), "eps_steps": f(0, torch.long)}
    return LPSolution(
        z=z, value=(c * z).sum(-1), dual=t(out.uA[0]), active=t(out.tA[0]),
        stats=stats, instance_stats=LazyStats(per),
        dual_eq=None if out.uE is None else t(out.uE[0]),
        dual_bounds=t(out.uz[0]), active_bounds=t(out.tz[0]),
        eps=torch.zeros((), dtype=f64, device="cpu") if forward == "newton" else None,
        penalty_z=penalty_z.detach() if penalty_z.requires_grad else penalty_z)
