r"""``forward="highs"``: HiGHS solves the LP on the CPU, the active-set backward differentiates it.

For a large general LP on the CPU, a simplex code is the fastest exact forward; what it lacks
is a gradient.  This backend takes HiGHS's optimal vertex (scipy's HiGHS bindings with the
options of ``scipy.optimize.linprog(method="highs")``, without its wrapper: :func:`_highs_direct`;
one LP at a time), then does exactly what the Newton path does after its last
penalty solve (:func:`solver.recover.recover_vertex`): the active set ``T`` (rows and bounds
tight at the vertex), one active-set solve that snaps the vertex onto ``{G_T z = h_T}`` (HiGHS
stops at its 1e-7 feasibility tolerance; the snap makes it exact to roundoff), the same KKT
certificate with least-norm multipliers on ``T``, and the same ``K_T`` factorisation that the
active-set backward (:mod:`solver.implicit`) solves with.  So ``z``, ``value``, ``dual`` and the
gradients equal the Newton forward's wherever the optimum is unique.  Where ``T`` is square (a
nondegenerate vertex) and the data are float64 on the CPU, all of this runs on the host with one
LU per LP (:mod:`solver.backends.square_active`: SuperLU of the active rows with the active bounds
eliminated; ``stats["active_factor"] == "sparse_lu"``, or ``"dense_lu"`` for a small dense LP);
anything else goes through the torch recovery.

One sparse float64 CPU LP (a ``torch.sparse_csr_tensor`` ``A``) skips this module's batched
entry point: :mod:`solver.backends.host_highs` calls :func:`solve_host` and the same certificate on the
tensor's arrays, without the problem build around them, and hands a vertex that does not
certify back here (``solved=``).

``forward="auto"`` (the default) also ends here for the LPs Newton hands over (stalled, not
converged, out of time, diverged; ``only=``), and for a large general LP on the CPU.  HiGHS
gets the time left of ``max_seconds`` as its ``time_limit``; past it:
:class:`solver.LPTimeLimitError`.

Limits: CPU tensors only (a CUDA tensor raises :class:`LPInputError`: HiGHS runs on the host
and a silent device round trip per call would hide a sync in a training step; move the data
with ``.cpu()`` or use the default ``forward="newton"``, which runs on the GPU);
``backward="active_set"`` only (there are no iterations to unroll); the Newton-only options
(``eps``, ``step``, ``sketch``, ``warm_start``, ...) are ignored; ``tol`` is the KKT acceptance
tolerance, ``linear_solver`` the backward's ``K_T`` solver.  The computation runs in float64
unless ``compute_dtype`` says otherwise (HiGHS is float64 anyway).
"""
from __future__ import annotations

import time
import warnings

import numpy as np
import scipy.sparse as sp
import torch
from scipy.optimize import linprog

from lpmetrics.solver.errors import LPInputError, LPNotConvergedWarning, LPSolverError, LPTimeLimitError
from lpmetrics.solver.backends import square_active
from lpmetrics.solver.recover import recover_vertex
from lpmetrics.solver.backends.scipy_ops import HostCSR, host_matrix


def check_call(prob, backward: str) -> None:
    if prob.device.type != "cpu":
        raise LPInputError(
            f"forward='highs' runs HiGHS on the CPU but the LP data are on {prob.device}; "
            f"move c, A, b (and A_eq, b_eq) to the CPU with .cpu(), or use the default "
            f"forward='newton', which solves on the GPU.")
    if backward != "active_set":
        raise LPInputError("forward='highs' has no iterations to unroll; use "
                           "backward='active_set' (or forward='newton' for 'unrolled').")


def _vec(t, i):
    return t[i].detach().cpu().to(torch.float64).numpy()


def _solve_one(prob, i, A, E, deadline=None):
    c = _vec(prob.c, i)
    b = _vec(prob.b, i) if prob.m else None
    b_eq = None if E is None else _vec(prob.b_eq, i)
    return solve_host(c, A if prob.m else None, b, E, b_eq, deadline)


def solve_host(c, A, b, E, b_eq, deadline=None):
    """HiGHS on one LP given as host arrays (``A``, ``b``: ``None`` for no inequality rows;
    ``E``, ``b_eq``: ``None`` for no equalities): ``(result, kind)``, ``kind`` the failure
    ("infeasible", "unbounded", "time_limit") or ``None``.  ``deadline``: a
    ``time.perf_counter()`` value; HiGHS's own clock stops it at the time left (status 1)."""
    limit = None if deadline is None else max(1e-3, deadline - time.perf_counter())
    res = _highs(c, A, b, E, b_eq, limit)
    if res.status == 1:
        return res, "time_limit"
    kind = {2: "infeasible", 3: "unbounded"}.get(res.status)
    if res.status == 4 and "unbounded or infeasible" in res.message.lower():
        # HiGHS's presolve can stop at "unbounded or infeasible": a feasibility LP decides
        feas = _highs(np.zeros_like(c), A, b, E, b_eq, limit)
        kind = "infeasible" if feas.status == 2 else "unbounded"
    return res, kind


def _highs(c, A, b, E, b_eq, time_limit):
    """``linprog(c, A_ub=A, b_ub=b, A_eq=E, b_eq=b_eq, bounds=(0, None), method="highs")``
    with HiGHS called directly (:func:`_highs_direct`) where scipy's bindings are there."""
    if _h is None:
        kw = {} if time_limit is None else {"options": {"time_limit": time_limit}}
        return linprog(c, A_ub=A, b_ub=b, A_eq=E, b_eq=b_eq, bounds=(0, None), method="highs",
                       **kw)
    return _highs_direct(c, A, b, E, b_eq, time_limit)


try:    # the HiGHS bindings scipy (pinned) ships and linprog calls
    from scipy.optimize._highspy import _core as _h
except ImportError:      # pragma: no cover - another scipy: linprog itself
    _h = None

# linprog's status codes for HiGHS's model status (scipy.optimize._linprog_highs)
_STATUS = {} if _h is None else {
    _h.HighsModelStatus.kOptimal: 0, _h.HighsModelStatus.kTimeLimit: 1,
    _h.HighsModelStatus.kIterationLimit: 1, _h.HighsModelStatus.kInfeasible: 2,
    _h.HighsModelStatus.kModelError: 2, _h.HighsModelStatus.kUnbounded: 3}


class _Result:
    """The fields of linprog's result that :func:`highs_forward` reads."""

    def __init__(self, status, message, x=None, row_dual=None, col_dual=None, m=0, nit=0):
        self.status, self.message, self.x, self.nit = status, message, x, nit
        if x is not None:   # linprog's marginals: d(value)/d(rhs) of the rows, the bounds
            self.ineqlin = _Marginals(row_dual[:m])
            self.eqlin = _Marginals(row_dual[m:])
            self.lower = _Marginals(col_dual)


class _Marginals:
    def __init__(self, marginals):
        self.marginals = marginals


def _highs_direct(c, A, b, E, b_eq, time_limit):
    """HiGHS on ``min c^T z, A z <= b, E z = b_eq, z >= 0`` through scipy's bindings, with the
    options ``linprog(method="highs")`` sets (presolve on, dual simplex, no output) but not its
    wrapper: linprog re-validates and converts the inputs, builds a CSC copy and reads the
    bound multipliers in a Python loop over the columns -- ~4 ms of the ~9 ms it took on the
    n = 500 LPs of ``scripts/solver/time_sparse_lp.py``.  The rows go to HiGHS as CSR
    (its row-wise format).  ``lower.marginals`` are the columns' reduced costs (linprog's keep
    them only at the nonbasic columns; at the basic ones they are zero up to roundoff, and
    :func:`solver.recover.recover_vertex` tries its least-norm multipliers first anyway)."""
    n, m = c.size, 0 if A is None else A.shape[0]
    p = 0 if E is None else E.shape[0]
    # (no copy of a CSR matrix or of HostCSR's arrays)
    rows = [X if isinstance(X, (sp.csr_matrix, HostCSR)) else sp.csr_matrix(X) for X in (A, E)
            if X is not None]
    M = rows[0] if len(rows) == 1 else sp.vstack([X.tocsr() for X in rows], format="csr")
    lp = _h.HighsLp()
    lp.num_col_, lp.num_row_ = n, m + p
    mat = lp.a_matrix_
    mat.num_col_, mat.num_row_, mat.format_ = n, m + p, _h.MatrixFormat.kRowwise
    mat.start_, mat.index_, mat.value_ = M.indptr, M.indices, M.data
    lp.col_cost_ = c
    lp.col_lower_, lp.col_upper_ = np.zeros(n), np.full(n, _h.kHighsInf)
    lo = np.full(m, -_h.kHighsInf)
    lp.row_lower_ = lo if E is None else np.concatenate([lo, b_eq])
    lp.row_upper_ = b if E is None else (b_eq if A is None else np.concatenate([b, b_eq]))
    highs, opts = _h._Highs(), _h.HighsOptions()
    opts.output_flag = opts.log_to_console = False
    opts.presolve = "on"
    opts.simplex_strategy = int(_h.simplex_constants.SimplexStrategy.kSimplexStrategyDual)
    if time_limit is not None:
        opts.time_limit = float(time_limit)
    highs.passOptions(opts)
    highs.passModel(lp)
    highs.run()
    status = highs.getModelStatus()
    text = highs.modelStatusToString(status)
    code = _STATUS.get(status, 4)
    if status == _h.HighsModelStatus.kUnboundedOrInfeasible:
        text = "The problem is unbounded or infeasible. " + text
    if code != 0:
        return _Result(code, text)
    sol, info = highs.getSolution(), highs.getInfo()
    return _Result(0, text, np.array(sol.col_value), np.array(sol.row_dual),
                   np.array(sol.col_dual), m,
                   info.simplex_iteration_count or info.ipm_iteration_count)


def _fail(kind, idx, detail):
    where = f"batch instances {idx[:10]}{'...' if len(idx) > 10 else ''}"
    if kind == "infeasible":
        msg = (f"LP infeasible ({where}; HiGHS, forward='highs'): no z >= 0 satisfies "
               f"A z <= b, A_eq z = b_eq. Check how the constraints are built (signs of b, "
               f"contradictory equalities) or relax them, e.g. with slack variables.")
    elif kind == "unbounded":
        msg = (f"LP unbounded ({where}; HiGHS, forward='highs'): c^T z decreases without "
               f"limit over the feasible set. Add bounds on z (e.g. box rows z <= u in A), "
               f"or check the sign of c (the solver minimises).")
    elif kind == "time_limit":
        return LPTimeLimitError(
            f"HiGHS ran past max_seconds ({where}; forward='highs'/'auto'): {detail} Allow "
            f"more time (max_seconds=..., None: no bound) or make the LP smaller.",
            stats={"forward": "highs", "converged": False}, instances=idx)
    else:
        msg = (f"HiGHS did not solve the LP ({where}): {detail} Try forward='newton', or "
               f"rescale the rows of A.")
    return LPSolverError(msg, kind=kind, stats={"forward": "highs", "converged": False},
                         instances=idx)


def highs_forward(prob, opts, method, deadline=None, only=None, start=None, solved=None):
    """Solve every LP of ``prob`` with HiGHS and recover the active set; returns the ``run``
    dict that :func:`solver.output.assemble` turns into an :class:`LPSolution`.

    ``only`` (``forward="auto"``'s hand-off): the batch indices HiGHS solves; every other LP
    keeps the vertex and multipliers of ``start`` (the Newton run's dict), and the whole batch
    then goes through the same recovery, so the backward is one active-set solve for all.
    ``deadline``: a ``time.perf_counter()`` value, passed to HiGHS as its time limit.
    ``solved``: ``{i: result}`` of LPs HiGHS has already solved (:mod:`solver.backends.host_highs`,
    whose certificate did not apply): not solved again."""
    xs, uA, uz, uE, nit = [], [], [], [], []
    bad = {}
    todo = set(range(prob.B)) if only is None else set(only)
    srec = None if start is None else start["rec"]
    for i in range(prob.B):
        if i not in todo:   # solved by Newton: its certified vertex and multipliers
            xs.append(_vec(srec.z, i))
            uA.append(_vec(srec.uA, i))
            uz.append(_vec(srec.uz, i))
            uE.append(None if srec.uE is None else _vec(srec.uE, i))
            nit.append(int(start["iterations"][i]))
            continue
        A = host_matrix(prob, "A", i)
        E = None if prob.A_eq is None else host_matrix(prob, "A_eq", i)
        res, kind = (solved[i], None) if solved and i in solved else \
            _solve_one(prob, i, A, E, deadline)
        if res.status != 0:
            bad.setdefault(kind or "not_converged", []).append((i, res.message))
            continue
        # scipy's marginals are d(value)/d(rhs): ours are u >= 0 with c + A^T uA - uz
        # + A_eq^T uE = 0, i.e. uA = -marginals, uE = -marginals, uz = +marginals
        xs.append(res.x)
        uA.append(-res.ineqlin.marginals if prob.m else np.zeros(0))
        uz.append(res.lower.marginals)
        uE.append(None if E is None else -res.eqlin.marginals)
        nit.append(res.nit)
    for kind in ("infeasible", "unbounded", "time_limit", "not_converged"):
        if kind in bad:
            idx = [i for i, _ in bad[kind]]
            raise _fail(kind, idx, bad[kind][0][1])

    def t(rows):
        return torch.as_tensor(np.stack(rows), dtype=prob.dtype, device=prob.device)

    x = t(xs)
    # a square active system (a nondegenerate vertex): factorised and certified on the host
    rec = square_active.recover(prob, x, opts.tol, torch.finfo(prob.dtype).eps ** 0.5)
    if rec is None:
        u = (t(uA), t(uz), None if prob.A_eq is None else t(uE))
        rec = recover_vertex(prob, x, u, method=method, cg_tol=opts.cg_tol,
                             cg_max_iter=4 * opts.cg_max_iter, accept_tol=opts.tol)
    done = rec.kkt <= opts.tol
    if not bool(done.all()):
        idx = (~done).nonzero().flatten().tolist()
        msg = (f"forward='highs': HiGHS's vertex does not pass the KKT check (batch "
               f"instances {idx[:10]}): residual {float(rec.kkt.max()):.2e} > tol={opts.tol:.1e}"
               f". The LP is probably badly scaled; rescale the rows of A, loosen tol, or try "
               f"forward='newton'.")
        if opts.on_fail == "raise":
            raise LPSolverError(msg, kind="not_converged",
                                stats={"forward": "highs", "converged": False}, instances=idx)
        warnings.warn(msg, LPNotConvergedWarning, stacklevel=3)
    zeros = torch.zeros(prob.B, dtype=prob.dtype)
    return {"rec": rec, "zp": x, "eps": zeros, "done": done,
            "diverged": torch.zeros_like(done), "eps_steps": zeros.long(),
            "iterations": torch.as_tensor(nit, dtype=torch.long),
            "cg_iterations": rec.system.cg_iterations}
