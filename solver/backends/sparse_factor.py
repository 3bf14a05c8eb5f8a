r"""``method="sparse"``: the Newton system factorised as a sparse matrix, one LP at a time.

``K = A^\top W_A A + \operatorname{diag}(w_z + \delta) + A_{eq}^\top A_{eq}`` is assembled
from the host copy of ``A`` (:func:`solver.backends.scipy_ops.to_scipy`; rows with ``w_A = 0`` are
dropped before the product, so ``K`` has at most ``sum_i nnz(row_i)^2`` entries) and factorised
by SuperLU (``scipy.sparse.linalg.splu``) in symmetric mode: a minimum-degree ordering of
``K + K^T`` and diagonal pivots, i.e. an ``LDL^T`` with a fill-reducing ordering, which is what
an SPD matrix needs (why SuperLU and not CHOLMOD or QDLDL: see :mod:`solver.linsolve`).

``pinv=True`` (recovery and backward, ``delta = 0``): ``K_T`` is singular where the active rows
do not pin down every variable (early eps stages, LPs whose optimum is not unique).  Variables
that no active row or bound touches (zero rows of ``K_T``) get ``x_j = 0`` -- exactly what the
pseudo-inverse does on that block -- and the rest is factorised.  If a pivot falls below
``_PIVOT_MIN`` times the largest diagonal (``LDL^T`` pivots are ``>= lambda_min``; a singular
matrix has a zero pivot up to roundoff), ``K^+`` is applied instead as the filter
:math:`F(K) = S - \rho S^2`, :math:`S = (K + \rho I)^{-1}`, :math:`\rho =` ``_RIDGE`` ``*
max diag K``: on an eigenvector :math:`F(\lambda) = \lambda / (\lambda + \rho)^2`, which is
exactly 0 on the null space (a plain ridge would return ``r_null / rho`` there) and
:math:`\approx 1/\lambda` for :math:`\lambda \gg \rho`; ``_REFINE`` refinement steps
``x += F(r - K x)`` shrink the error on the range by :math:`2\rho/\lambda` each.  This is the
sparse counterpart of the Cholesky path's truncated eigendecomposition (which drops
eigenvalues below ``10 n eps64 max``); ``fallbacks`` counts the LPs that needed it.

Dense rows: one row touching most variables (a budget row ``1^T z <= s`` of
``A``, a simplex row ``1^T z = 1`` of ``A_eq``) alone makes ``K`` dense.  The rows of ``A`` and
``A_eq`` that :func:`solver.backends.scipy_ops.dense_rows` names (at most ``MAX_DENSE_ROWS`` each, and
only while ``n`` is small enough for the dense minimum-norm solve below) are left out of the
pattern, and a Newton step (``delta > 0``, so the rest ``K_s`` is positive definite) solves with
:math:`K = K_s + U^\top U`, :math:`U = [W_d^{1/2} A_d; A_{eq,d}]` (the active dense rows of
``A``, every dense row of ``A_eq``) by the Sherman-Morrison-Woodbury identity
:math:`K^{-1} r = y - Z (I + U Z)^{-1} U y`, :math:`y = K_s^{-1} r`, :math:`Z = K_s^{-1} U^\top`:
one sparse LU of ``K_s`` and ``r_d`` extra solves per step instead of a dense ``n x n``
factorisation, so the step costs what the sparse rows cost (the dense-column treatment of
interior-point codes, e.g. Andersen 1996, "A modified Schur complement method for handling
dense columns in interior-point methods for linear programming", ACM TOMS 22).  The
minimum-norm solves (``pinv``, ``delta = 0``: ``K_s`` may be singular where only a dense row
pins a variable) add ``U^T U`` to ``K_s`` and factorise the sum as before.

These solves are plain data (scipy on the host): :func:`solver.linsolve.choose_method` never
picks them when autograd must run through the Newton iterations (``backward="unrolled"``); the
active-set backward only ever solves with a constant ``K_T``.
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp
import torch
from scipy.linalg import lu_factor, lu_solve
from scipy.sparse.linalg import splu

from lpmetrics.solver.backends.scipy_ops import dense_rows, host_matrix

# SuperLU options for a symmetric positive (semi)definite matrix
_LU = dict(permc_spec="MMD_AT_PLUS_A", diag_pivot_thresh=0.0,
           options=dict(SymmetricMode=True))
# a pivot below this fraction of max(diag K) marks K_T numerically singular
_PIVOT_MIN = 1e-10
# singular K_T: ridge of the filtered pseudo-inverse (relative to max diag K) and refinement
# steps; directions with lambda >~ 1e3 rho (1e-6 max diag) are inverted to ~1e-11
_RIDGE = 1e-9
_REFINE = 3


class _Pattern:
    """The fixed sparsity pattern of ``K`` (that of ``A^T A + I + A_eq^T A_eq``, CSC) and the
    map that fills its values for any ``W_A``: row ``i`` of ``A`` adds ``a_ij a_ik`` to
    ``K_jk``, so ``K.data = P w_A + D (w_z + delta) + (A_eq^T A_eq).data`` with a constant
    sparse ``P`` (``sum_i nnz(row_i)^2`` entries).  One Newton step's assembly is then one
    sparse product instead of a row selection, a sparse-sparse product and a sum."""

    def __init__(self, A, E, n, dense, dense_eq):
        A = A.tocsr()
        A.sum_duplicates()
        # dense rows (``dense`` of A, ``dense_eq`` of A_eq: their indices,
        # :func:`solver.backends.scipy_ops.dense_rows`): left out of the pattern, kept as dense blocks
        # ``D`` and ``D_eq`` (module docstring)
        self.dense, self.rows, self.D, self.D_eq = dense, None, None, None
        if dense.size:
            self.rows = np.setdiff1d(np.arange(A.shape[0]), dense)
            self.D = A[dense].toarray()
            A = A[self.rows]
        if dense_eq.size:
            E = E.tocsr()
            self.D_eq = E[dense_eq].toarray()
            E = E[np.setdiff1d(np.arange(E.shape[0]), dense_eq)]
        m = A.shape[0]
        counts = np.diff(A.indptr)
        rep = np.repeat(counts, counts)                # per nonzero: its row's length
        first = np.repeat(np.arange(A.nnz), rep)
        start = np.repeat(np.repeat(A.indptr[:-1], counts), rep)
        second = start + np.arange(first.size) - np.repeat(np.cumsum(rep) - rep, rep)
        pair_row = np.repeat(np.repeat(np.arange(m), counts), rep)
        r, c = A.indices[first], A.indices[second]
        diag = np.arange(n)
        ete = None if E is None else (E.T @ E).tocoo()
        rows = [r, diag] + ([] if ete is None else [ete.row])
        cols = [c, diag] + ([] if ete is None else [ete.col])
        keys = np.concatenate(cols).astype(np.int64) * n + np.concatenate(rows)
        uniq, pos = np.unique(keys, return_inverse=True)      # column-major = CSC order
        self.indices = (uniq % n).astype(np.int32)
        self.indptr = np.searchsorted(uniq // n, np.arange(n + 1)).astype(np.int32)
        self.n, self.nnz = n, uniq.size
        self.P = sp.csr_matrix((A.data[first] * A.data[second], (pos[:r.size], pair_row)),
                               shape=(self.nnz, m))
        self.diag_pos = pos[r.size:r.size + n]
        self.const = np.zeros(self.nnz)
        if ete is not None:
            np.add.at(self.const, pos[r.size + n:], ete.data)

    def matrix(self, wA, wz_delta):
        """``K_s``: ``K`` without the dense rows (``wA``: the weights of every row of ``A``)."""
        data = self.P @ (wA if self.rows is None else wA[self.rows]) + self.const
        data[self.diag_pos] += wz_delta
        # (copies: eliminate_zeros works in place on the pattern's arrays)
        K = sp.csc_matrix((data, self.indices.copy(), self.indptr.copy()),
                          shape=(self.n, self.n))
        K.eliminate_zeros()      # the rows off in W_A: SuperLU's ordering sees only the rest
        return K


def _pattern(prob, i):
    """The :class:`_Pattern` of instance ``i``, cached on the problem (constant data)."""
    shared = prob.A.batch_size is None and (prob.A_eq is None or prob.A_eq.batch_size is None)
    key = 0 if shared else i
    cache = prob.__dict__.setdefault("_sparse_pattern", {})
    if key not in cache:
        E = None if prob.A_eq is None else host_matrix(prob, "A_eq", key, sparse=True)
        cache[key] = _Pattern(host_matrix(prob, "A", key, sparse=True), E, prob.n,
                              dense_rows(prob, "A"), dense_rows(prob, "A_eq"))
    return cache[key]


def _assemble(prob, i, wA, wz_delta):
    """``K`` of instance ``i`` by a row selection and one sparse product: cheaper than
    building the :class:`_Pattern` when only one or two systems are solved (a recovery from
    HiGHS's vertex); the Newton iterations build the pattern and their recoveries reuse it."""
    A = host_matrix(prob, "A", i, sparse=True)
    Aw = A[wA > 0]
    K = Aw.T @ Aw + sp.diags(wz_delta)
    if prob.A_eq is not None:
        E = host_matrix(prob, "A_eq", i, sparse=True)
        K = K + E.T @ E
    return K.tocsc()


class SparseFactors:
    """Per-LP factorisations of ``K``; ``solve(r [B, n])`` returns ``K^{-1} r`` (``K^+ r``)."""

    def __init__(self, prob, wA, wz, delta, pinv):
        self.prob, self.pinv = prob, pinv
        self.fallbacks = 0
        wA = wA.detach().to(device="cpu", dtype=torch.float64).numpy()
        wzd = (wz.detach() + delta.detach().unsqueeze(-1)).to(device="cpu",
                                                              dtype=torch.float64).numpy()
        direct = pinv and "_sparse_pattern" not in prob.__dict__
        delta = delta.detach().to(device="cpu", dtype=torch.float64).expand(prob.B).numpy()
        self._solvers = [self._factor(_assemble(prob, i, wA[i], wzd[i])) if direct
                         else self._factor_pattern(_pattern(prob, i), wA[i], wzd[i], delta[i])
                         for i in range(prob.B)]

    def _factor_pattern(self, pat, wA, wzd, delta):
        K = pat.matrix(wA, wzd)
        on = pat.dense[wA[pat.dense] > 0]
        if on.size == 0 and pat.D_eq is None:
            return self._factor(K)
        # the active dense rows of A (weighted) and the dense rows of A_eq (always on)
        U = np.sqrt(wA[on])[:, None] * pat.D[np.searchsorted(pat.dense, on)] if on.size \
            else np.zeros((0, K.shape[0]))
        if pat.D_eq is not None:
            U = np.vstack([U, pat.D_eq])
        if self.pinv or not delta > 0:     # K_s may be singular: factorise K itself
            return self._factor((K + sp.csc_matrix(U.T @ U)).tocsc())
        return _low_rank_solve(splu(K, **_LU).solve, U)

    def _factor(self, K):
        if not self.pinv:
            return splu(K, **_LU).solve
        d = K.diagonal()
        keep = np.flatnonzero(d > 0)
        if keep.size == 0:
            return np.zeros_like
        Kk = K[keep][:, keep].tocsc() if keep.size < K.shape[0] else K
        try:
            lu = splu(Kk, **_LU)
            ok = np.abs(lu.U.diagonal()).min() > _PIVOT_MIN * d.max()
        except RuntimeError:       # an exactly zero pivot
            ok = False
        if not ok:
            self.fallbacks += 1
            lu = _FilteredRidge(Kk, _RIDGE * d.max())
        if keep.size == K.shape[0]:
            return lu.solve

        def solve(r):
            x = np.zeros_like(r)
            x[keep] = lu.solve(np.ascontiguousarray(r[keep]))
            return x
        return solve

    def solve(self, r: torch.Tensor) -> torch.Tensor:
        B, n = self.prob.B, self.prob.n
        r64 = r.detach().to(device="cpu", dtype=torch.float64).expand(B, n).numpy()
        x = np.stack([f(np.ascontiguousarray(r64[i])) for i, f in enumerate(self._solvers)])
        return torch.from_numpy(x).to(device=r.device, dtype=r.dtype)


def _low_rank_solve(solve_s, U):
    """``r -> (K_s + U^T U)^{-1} r`` from ``solve_s = K_s^{-1}`` (Sherman-Morrison-Woodbury).
    ``C = I + U K_s^{-1} U^T`` is SPD but can be very ill-conditioned (cond 1e8-1e10 where a
    variable is held only by the dense rows and ``delta``, default 1e-10 relative) while ``K``
    is not: it is factorised (LU, backward stable), never inverted -- an explicit inverse lost
    every digit there and Newton stopped converging (review of ce44f39)."""
    Z = solve_s(np.ascontiguousarray(U.T))                 # K_s^-1 U^T, [n, r]
    C = lu_factor(np.eye(U.shape[0]) + U @ Z)              # r x r (r <= MAX_DENSE_ROWS)

    def solve(r):
        y = solve_s(r)
        return y - Z @ lu_solve(C, U @ y)
    return solve


class _FilteredRidge:
    """``K^+`` of a singular PSD ``K`` by the filter ``S - rho S^2`` (module docstring)."""

    def __init__(self, K, rho):
        self.K, self.rho = K, rho
        self.lu = splu((K + sp.identity(K.shape[0], format="csc") * rho).tocsc(), **_LU)

    def _filter(self, r):
        y = self.lu.solve(r)
        return y - self.rho * self.lu.solve(y)

    def solve(self, r):
        x = self._filter(r)
        for _ in range(_REFINE):
            x = x + self._filter(r - self.K @ x)
        return x
