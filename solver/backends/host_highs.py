r"""One sparse float64 CPU LP for HiGHS (``forward="highs"``), end to end on the host.

:func:`solver.solve_lp`'s general route to HiGHS builds the batched problem
(:func:`solver.problem.build_problem`: checks, flattening, scales, a ``torch.sparse`` ``A``
turned into a COO :class:`solver.operators.SparseOperator`), picks the linear solver from the
row counts (:func:`solver.linsolve.choose_method`), copies ``A`` back to a scipy CSR matrix for
HiGHS (:func:`solver.backends.scipy_ops.host_matrix`), certifies HiGHS's vertex on the host
(:func:`solver.backends.square_active.recover`), and assembles the solution and its statistics from torch
tensors.  On the LPs of ``scripts/solver/time_sparse_lp.py`` (``n = 500``, HiGHS ~5 ms) that glue was
~1.5 ms of what ``forward="highs"`` added to HiGHS's own time.  :func:`solve`
takes the same steps on the host arrays: the CSR arrays of the torch tensor go to HiGHS and
to the certificate as they are (:func:`solver.backends.highs.solve_host`,
:func:`solver.backends.square_active.certify` with :func:`solver.backends.square_active.sparse_factor`), the
solver choice comes from the CSR row lengths (:func:`solver.linsolve.auto_method`, the rule
``choose_method`` applies), and the solution from
:func:`solver.backends.host_guess.certified_solution`, whose backward is the general route's
(:class:`solver.backends.square_active._SquareVertex`).  Every field and every gradient equals the
general route's bit for bit (``tests/test_solver_host_highs.py``).

Scope: ``c [n]``, ``b [m]`` (``m >= 1``; and ``b_eq [p]``) dense float64 CPU tensors; ``A``
(and ``A_eq``) a 2-D float64 ``torch.sparse_csr_tensor`` on the CPU that does not require grad,
with sorted, distinct column indices in each row; ``backward="active_set"``; ``forward="highs"``,
or ``"auto"`` where it sends this LP to HiGHS (:func:`solver.backends.auto.route`, and ``A`` not one
nonzero per row, which stays with Newton); ``linear_solver="auto"``; no ``compute_dtype`` but
float64.  Anything else, or non-finite data, returns ``(None, None)`` and the general route
runs (it names bad input).  HiGHS's failures raise here, with the general route's typed errors
(:func:`solver.backends.highs._fail`).  A vertex that does not certify (degenerate, ill-conditioned)
returns ``(None, {0: result})``: the general route then recovers it with the torch path without
solving the LP again.
"""
from __future__ import annotations

import math
import weakref

import numpy as np
import torch
from torch.utils.weak import WeakIdKeyDictionary

from lpmetrics.solver.backends.auto import route
from lpmetrics.solver.backends.highs import _fail, solve_host
from lpmetrics.solver.backends.host_guess import certified_solution
from lpmetrics.solver.linsolve import auto_method
from lpmetrics.solver.backends.scipy_ops import HostCSR, gram_nnz_of
from lpmetrics.solver.solution import LPSolution
from lpmetrics.solver.backends.square_active import HostLP, _host, certify, sparse_factor

# tests switch it off to compare with the general route
ENABLED = True
f64 = torch.float64
TIGHT_REL = torch.finfo(f64).eps ** 0.5     # solver.backends.highs: the tight-set threshold
# per constraint tensor (held weakly, by identity: nothing is added to the tensor, which stays
# picklable with torch.load's weights_only): its host arrays and row counts, and the solver
# choice; the arrays are views of the tensor's index and value tensors, not of the tensor
_CSR_MEMO: WeakIdKeyDictionary = WeakIdKeyDictionary()
_METHOD_MEMO: WeakIdKeyDictionary = WeakIdKeyDictionary()


def _vector(t, size=None) -> bool:
    return (isinstance(t, torch.Tensor) and t.dtype == f64 and t.layout == torch.strided
            and t.device.type == "cpu" and t.dim() == 1 and (size is None or t.shape[0] == size))


def _csr(M, n) -> tuple[HostCSR, np.ndarray, tuple] | None:
    """``(arrays, nonzeros per row, key)`` of a 2-D float64 CPU ``torch.sparse_csr_tensor``
    ``M`` with ``n`` columns, sorted and distinct columns in every row and no grad (its arrays
    shared, not copied); else ``None``.  Kept for the next call with the same tensor (a
    constraint matrix is usually built once; :data:`_CSR_MEMO`), under a key of its index and
    value arrays' addresses and versions: an in-place change of the pattern is noticed."""
    if not (isinstance(M, torch.Tensor) and M.layout == torch.sparse_csr and M.dtype == f64
            and M.device.type == "cpu" and M.dim() == 2 and M.shape[1] == n
            and not M.requires_grad):
        return None
    parts = M.crow_indices(), M.col_indices(), M.values()
    key = tuple((t.data_ptr(), t._version) for t in parts) + (tuple(M.shape),)
    memo = _CSR_MEMO.get(M)
    if memo is not None and memo[0] == key:
        return memo[1]
    ptr, idx, val = (t.numpy() for t in parts)
    counts = np.diff(ptr)
    out = HostCSR(ptr, idx, val, tuple(M.shape)), counts, key
    # torch does not check a CSR tensor's invariants by default, and HiGHS and scipy's kernels
    # index without bounds checks: a malformed tensor goes to the general route, which names it
    if not (ptr.size == M.shape[0] + 1 and ptr[0] == 0 and ptr[-1] == idx.size == val.size
            and bool((counts >= 0).all()) and (not idx.size or 0 <= idx.min() <= idx.max() < n)):
        out = None
    elif idx.size:
        # within each row the columns increase: the layout of the general route's coalesced
        # operator, so both routes hand HiGHS and the certificate the same arrays
        step = np.diff(idx)
        first = np.zeros(idx.size - 1, dtype=bool)
        starts = ptr[1:-1]
        first[starts[(starts > 0) & (starts < idx.size)] - 1] = True
        if not bool(((step > 0) | first).all()):
            out = None
    _CSR_MEMO[M] = key, out
    return out


def _method(A, A_eq, n, counts, keys) -> str:
    """``linear_solver="auto"``'s choice for these row counts (:func:`solver.linsolve.auto_method`
    as :func:`solver.linsolve.choose_method` applies it to a sparse LP).  Kept per tensor ``A``
    under its pattern key and, where there are equality rows, a weak reference to the ``A_eq``
    tensor and its key (``keys``: :func:`_csr`'s keys of ``A`` and ``A_eq``): a key of addresses
    alone could match another tensor made where a freed one was, a live reference cannot."""
    memo = _METHOD_MEMO.get(A)
    if memo is not None and memo[0] == keys and (A_eq is None) == (memo[1] is None) and (
            A_eq is None or memo[1]() is A_eq):
        return memo[2]
    method = auto_method(n, diagonal_ok=len(counts) == 1 and int(counts[0].max()) <= 1,
                         sparse_ok=True, gram_nnz=lambda: gram_nnz_of(n, counts),
                         dense_gram_cheap=True)
    _METHOD_MEMO[A] = keys, None if A_eq is None else weakref.ref(A_eq), method
    return method


def solve(c, A, b, A_eq, b_eq, opts, backward: str, t0: float
          ) -> tuple[LPSolution | None, dict | None]:
    """``(solution, None)`` for a call in scope (see the module docstring) whose vertex
    certifies; ``(None, {0: HiGHS's result})`` where it does not; ``(None, None)`` out of
    scope."""
    if (not ENABLED or backward != "active_set" or opts.linear_solver != "auto"
            or opts.compute_dtype not in (None, f64) or (A_eq is None) != (b_eq is None)
            or opts.forward not in ("highs", "auto") or not _vector(c)):
        return None, None
    n = c.shape[0]
    if not _vector(b) or b.shape[0] == 0:
        return None, None
    pa, pe = _csr(A, n), None if A_eq is None else _csr(A_eq, n)
    if pa is None or pa[0].shape[0] != b.shape[0] or (A_eq is not None and (
            pe is None or not _vector(b_eq, pe[0].shape[0]))):
        return None, None
    (Ah, ca, ka), (Eh, ce, ke) = pa, (None, None, None) if pe is None else pe
    counts = [ca] if Eh is None else [ca, ce]
    method = _method(A, A_eq, n, counts, (ka, ke))
    if opts.forward == "auto" and (method == "diagonal" or
                                   route(c, A, A_eq, opts, backward) != "highs"):
        return None, None                    # Newton's LPs
    ch, bh = _host(c), _host(b)
    beh = None if Eh is None else _host(b_eq)
    # one sum per array: finite iff no entry is NaN/Inf (the general route names the culprit)
    arrays = [ch, bh, Ah.data] + ([] if Eh is None else [beh, Eh.data])
    if not all(math.isfinite(a.sum()) for a in arrays):
        return None, None
    deadline = None if opts.max_seconds is None else t0 + opts.max_seconds
    res, kind = solve_host(ch, Ah, bh, Eh, beh, deadline)
    if res.status != 0:
        raise _fail(kind or "not_converged", [0], res.message)
    hmax = max(np.abs(bh).max(), np.abs(beh).max() if beh is not None and beh.size else 0.0)
    lp = HostLP(ch[None], bh[None], None if beh is None else beh[None],
                np.array([1.0 + hmax]), np.array([np.abs(ch).max()]),
                lambda i: (Ah, Eh), lambda i, *data_and_sets: sparse_factor(*data_and_sets))
    out = certify(lp, res.x[None], 1e-8 if opts.tol is None else opts.tol, TIGHT_REL)
    if out is None:
        return None, {0: res}
    sol = certified_solution(c, (None, b, None, b_eq), lambda: (None, None), out, "sparse",
                             iterations=res.nit, method=method, forward="highs",
                             penalty_z=torch.from_numpy(res.x), t0=t0)
    return sol, None
