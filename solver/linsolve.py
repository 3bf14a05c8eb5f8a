r"""The Newton system :math:`K = A^\top W_A A + W_z + A_{eq}^\top A_{eq} + \delta I`.

``W_A``/``W_z`` are the 0-1 diagonals of the generalized Hessian (Mangasarian 2004, JOTA 121,
eq. (11); Meng et al. 2021, eq. 5): the rows of ``A z <= b`` and of ``z >= 0`` that are violated
at the current iterate.  The same matrix with the final active set (and ``delta = 0``) is the normal
matrix of the primal recovery and of the active-set backward, so one class serves all three.

Solvers (``method``):

* ``"diagonal"``: every row of ``A`` has one nonzero (e.g. ``A = -I``): ``K`` is diagonal, O(m).
* ``"cholesky"``: dense ``[B, n, n]`` batched Cholesky (small dense problems); with
  ``pinv=True`` a float64 eigendecomposition gives the minimum-norm (pseudo-inverse) solution
  used where the active rows do not pin down a vertex.
* ``"cg"``: batched Jacobi-preconditioned conjugate gradients, products only.
* ``"sparse"``: ``K`` assembled as a sparse matrix on the host and factorised by SuperLU, one LP
  at a time (:mod:`solver.backends.sparse_factor`).

Why SuperLU (``scipy.sparse.linalg.splu``) for ``"sparse"``: it ships inside the pinned scipy
wheel (no new dependency, nothing to compile), and in symmetric mode (minimum-degree ordering of
``K + K^T``, diagonal pivots) it is a fill-reducing ``LDL^T`` of our SPD ``K``.  CHOLMOD
(scikit-sparse) would be faster on big fill but needs SuiteSparse from the system, not a wheel;
QDLDL only arrives as a cvxpy dependency, not one we pin.  Preconditioned CG was the other
option: with the Jacobi preconditioner it took 390 CG iterations per Newton step on average
(77,640 over 200 steps; 20 s against 0.4 s factorised) on the random sparse LP of
``scripts/solver/bench_solver_measure.py`` (``n = 500``, density 5e-3): ``delta`` is 1e-10 relative, so
``K`` is as ill-conditioned as ``A^T W A``, and a diagonal preconditioner does not fix that.

The minimum-norm solves of the recovery and the active-set backward (``pinv=True``) of a CPU
LP with sparse ``A``/``A_eq``: when the active system is square and nonsingular they use one
sparse LU of the active rows, ``K_T^{-1} = M^{-1} M^{-T}`` (:mod:`solver.backends.active_lu`), whatever
``method`` is (``"cholesky"``/``"sparse"``): ``K_T`` is dense as soon as one active row is,
``M`` never is; ``factor_kind`` (``stats["active_factor"]``) says which ran.

Choice (``linear_solver="auto"``, :func:`choose_method`): diagonal when the gram is diagonal
(a diagonal operator, or a sparse ``A`` with at most one nonzero per row);
``"sparse"`` on the CPU when ``A`` (and ``A_eq``) are sparse/structured, ``n >= SPARSE_MIN_N``
and the bound ``sum_i nnz(row_i)^2 / n^2`` on the density of ``K`` is below
``SPARSE_MAX_DENSITY`` with at most ``SPARSE_MAX_NNZ`` products (and the Newton iterations need
no autograd; up to ``MAX_DENSE_ROWS`` dense rows of ``A`` and of ``A_eq``, e.g. a budget row
``1^T z <= s``, do not count: they enter the sparse solve as a low-rank update,
:mod:`solver.backends.sparse_factor`); else
dense Cholesky up to ``n = 2048``; else CG.  ``stats["linear_solver"]``
reports the choice.

Everything is written with differentiable torch ops, so the unrolled backward can run through it.
"""
from __future__ import annotations

import torch

from lpmetrics.solver.errors import LPInputError
from lpmetrics.solver.backends.scipy_ops import gram_nnz, row_counts
from lpmetrics.solver.backends import active_lu
from lpmetrics.solver.backends.sparse_factor import SparseFactors

# below this n the batched dense Cholesky is as fast (fwd+bwd of random sparse LPs, one
# thread: n = 64 equal, n = 128 dense 75 ms vs sparse 57 ms, n = 256 224 vs 182 ms; n = 500
# 1.4 s vs 0.4 s) and it batches without a Python loop over the LPs
SPARSE_MIN_N = 256
# K denser than this fills in: dense Cholesky or CG (n = 256 at row density 3e-2, bound 0.26:
# the two direct solvers tie)
SPARSE_MAX_DENSITY = 0.05
# the assembly map holds sum_i nnz(row_i)^2 products (12 bytes each)
SPARSE_MAX_NNZ = 5_000_000
METHODS = ("diagonal", "cholesky", "cg", "sparse")


def _one_per_row(op) -> bool:
    """A sparse ``A`` with at most one nonzero per row (``A = -I`` given as ``torch.sparse``)
    has a diagonal gram, like a ``DiagonalOperator``: the same O(m) separable path applies."""
    counts = row_counts(op)
    return counts is not None and (counts.numel() == 0 or int(counts.max()) <= 1)


def auto_method(n: int, *, diagonal_ok: bool, sparse_ok: bool, gram_nnz, dense_gram_cheap: bool
                ) -> str:
    """``linear_solver="auto"``'s choice for ``n`` variables: "diagonal" for a diagonal gram,
    "sparse" where allowed (``sparse_ok``: CPU, not unrolled) and ``gram_nnz()`` (a bound of
    ``nnz(K)``, ``None`` for a dense block) is small enough, else "cholesky" or "cg"."""
    if diagonal_ok:
        return "diagonal"
    if sparse_ok and n >= SPARSE_MIN_N:
        nnz = gram_nnz()
        if nnz is not None and nnz <= min(SPARSE_MAX_DENSITY * n ** 2, SPARSE_MAX_NNZ):
            return "sparse"
    if dense_gram_cheap and n <= 2048:
        return "cholesky"
    return "cg"


def choose_method(prob, requested: str, unrolled: bool = False) -> str:
    """The Newton-system solver; ``unrolled``: autograd runs through the Newton iterations
    (rules out ``"sparse"``, whose host solves are not differentiable)."""
    ops = [prob.A] + ([prob.A_eq] if prob.A_eq is not None else [])
    diagonal_ok = prob.A_eq is None and (prob.A.gram_is_diagonal or _one_per_row(prob.A))
    if requested == "auto":
        return auto_method(prob.n, diagonal_ok=diagonal_ok,
                           sparse_ok=not unrolled and prob.device.type == "cpu",
                           gram_nnz=lambda: gram_nnz(prob),
                           dense_gram_cheap=all(op.dense_gram_is_cheap for op in ops))
    if requested == "diagonal" and not diagonal_ok:
        raise LPInputError("linear_solver='diagonal' needs a diagonal-gram A (e.g. "
                           "DiagonalOperator) and no equality rows; use 'auto'.")
    if requested == "sparse" and unrolled:
        raise LPInputError("linear_solver='sparse' solves on the host and cannot be unrolled; "
                           "use backward='active_set', or linear_solver='cg' or 'cholesky'.")
    if requested not in METHODS:
        raise LPInputError(f"linear_solver={requested!r}; choose auto, diagonal, cholesky, cg "
                           f"or sparse.")
    return requested


def diag_scale(prob) -> torch.Tensor:
    """Mean diagonal of ``G^T G`` per LP: the scale that ``delta`` is relative to."""
    with torch.no_grad():
        ones = torch.ones(prob.B, prob.m, dtype=prob.dtype, device=prob.device)
        s = 1.0 + prob.A.gram_diag(ones).expand(prob.B, prob.n).mean(-1)
        if prob.A_eq is not None:
            ones = torch.ones(prob.B, prob.p, dtype=prob.dtype, device=prob.device)
            s = s + prob.A_eq.gram_diag(ones).expand(prob.B, prob.n).mean(-1)
    return s


def _constant_mode(prob):
    """True when products with the problem data record no graph (no grad mode, or data that
    does not require grad): then casts and the constant ``A_eq^T A_eq`` can be cached on the
    problem and reused by every Newton step / recovery of the solve."""
    if not torch.is_grad_enabled():
        return True
    ops = [prob.A] + ([prob.A_eq] if prob.A_eq is not None else [])
    return not any(t.requires_grad for op in ops for t in op.tensors())


def _cast(prob, name, dtype):
    op = getattr(prob, name)
    if op.dtype == dtype:
        return op
    if not _constant_mode(prob):
        return op.to(dtype)
    cache = prob.__dict__.setdefault("_cast_cache", {})
    key = (name, dtype)
    if key not in cache:
        with torch.no_grad():
            cache[key] = op.to(dtype)
    return cache[key]


def _eq_gram(prob, dtype):
    """``A_eq^T A_eq`` (dense ``[B or 1, n, n]``) in ``dtype``; cached when constant."""
    def build():
        E = _cast(prob, "A_eq", dtype)
        ones = torch.ones(prob.B, prob.p, dtype=dtype, device=prob.device)
        return E.gram(ones)
    if not _constant_mode(prob):
        return build()
    cache = prob.__dict__.setdefault("_eq_gram_cache", {})
    if dtype not in cache:
        with torch.no_grad():
            cache[dtype] = build()
    return cache[dtype]


# cond(K) bound below which K^+ = K^-1 is taken from a Cholesky factor instead of an
# eigendecomposition (~8x cheaper at n = 65).  The eigen path keeps every eigenvalue above
# 10 n eps64 * lambda_max, i.e. it inverts K exactly when cond(K) < 1 / (10 n eps64) (> 1e12
# for n < 4e3); 1e8 leaves a wide margin, so both paths compute the same K^-1 up to roundoff.
_CHOL_COND_MAX = 1e8


def _certified_cholesky(K):
    """Cholesky factor of the float64 ``K [B, n, n]`` if every ``K`` is provably well
    conditioned (``trace(K) * |L^-1|_F^2 >= cond(K)`` below ``_CHOL_COND_MAX``), else None."""
    L, info = torch.linalg.cholesky_ex(K)
    if bool((info != 0).any()):
        return None
    eye = torch.eye(K.shape[-1], dtype=K.dtype, device=K.device)
    Linv = torch.linalg.solve_triangular(L, eye, upper=False)
    bound = K.diagonal(dim1=-2, dim2=-1).sum(-1) * Linv.square().sum((-2, -1))
    if not bool((bound <= _CHOL_COND_MAX).all()):   # also rejects NaN
        return None
    return L


class NewtonSystem:
    """``K x = r`` for a batch; ``wA [B, m]``, ``wz [B, n]`` are 0/1, ``delta [B]``."""

    def __init__(self, prob, wA, wz, delta, method, *, pinv=False, cg_tol=1e-10,
                 cg_max_iter=500):
        self.prob, self.wA, self.wz, self.delta = prob, wA, wz, delta
        self.method, self.pinv = method, pinv
        self.cg_tol, self.cg_max_iter = cg_tol, cg_max_iter
        self.cg_iterations = 0
        self._factor = None
        # the minimum-norm solves of a square active system of a sparse LP: sparse LU of the
        # active rows (solver.backends.active_lu) instead of the normal equations; tried on first solve
        self._lu = None if pinv and method in ("cholesky", "sparse") else False
        self.factor_kind = method

    # -- products -------------------------------------------------------------------------
    def matvec(self, x):
        p = self.prob
        y = p.A.rmatvec(self.wA * p.A.matvec(x)) + (self.wz + self.delta.unsqueeze(-1)) * x
        if p.A_eq is not None:
            y = y + p.A_eq.rmatvec(p.A_eq.matvec(x))
        return y

    def diagonal(self):
        if getattr(self, "_diag", None) is not None:
            return self._diag
        p = self.prob
        d = p.A.gram_diag(self.wA).expand_as(self.wz) + self.wz + self.delta.unsqueeze(-1)
        if p.A_eq is not None:
            ones = torch.ones(p.B, p.p, dtype=d.dtype, device=d.device)
            d = d + p.A_eq.gram_diag(ones)
        if not torch.is_grad_enabled() or not d.requires_grad:
            self._diag = d
        return d

    def dense(self, dtype=None):
        p = self.prob
        A = p.A if dtype is None else _cast(p, "A", dtype)
        wA = self.wA if dtype is None else self.wA.to(dtype)
        K = A.gram(wA).expand(p.B, p.n, p.n)
        dvec = self.wz + self.delta.unsqueeze(-1)
        K = K + torch.diag_embed(dvec if dtype is None else dvec.to(dtype))
        if p.A_eq is not None:
            K = K + _eq_gram(p, K.dtype)
        return K

    # -- solves ---------------------------------------------------------------------------
    def solve(self, r):
        if self.method == "diagonal":
            return self._solve_diagonal(r)
        if self._lu is None:
            self._lu = (active_lu.eligible(self.prob)
                        and active_lu.ActiveLU.build(self.prob, self.wA, self.wz)) or False
            if self._lu:
                self.factor_kind = "active_lu"
        if self._lu:
            return self._lu.solve(r)
        if self.method == "cholesky":
            return self._solve_pinv(r) if self.pinv else self._solve_cholesky(r)
        if self.method == "sparse":
            if self._factor is None:
                self._factor = SparseFactors(self.prob, self.wA, self.wz, self.delta,
                                             self.pinv)
            return self._factor.solve(r)
        return self._solve_cg(r)

    def _solve_diagonal(self, r):
        if not self.pinv:
            return r / self.diagonal()
        if self._factor is None:
            d = self.diagonal()
            tiny = 1e3 * torch.finfo(d.dtype).eps * d.detach().abs().amax(-1, keepdim=True)
            big = d > tiny
            self._factor = torch.where(big, 1.0 / torch.where(big, d, tiny), 0.0)
        return r * self._factor

    def _solve_cholesky(self, r):
        if self._factor is None:
            K = self.dense()
            scale = self.delta
            for _ in range(4):
                L, info = torch.linalg.cholesky_ex(K)
                if not bool((info > 0).any()):
                    break
                # numerically singular: strengthen the regularisation (only where it failed)
                bump = torch.where(info > 0, 100 * scale, torch.zeros_like(scale))
                K = K + torch.diag_embed(bump.unsqueeze(-1).expand(-1, K.shape[-1]))
                scale = scale * 100
            self._factor = L
        return torch.cholesky_solve(r.unsqueeze(-1), self._factor).squeeze(-1)

    def _solve_pinv(self, r):
        if self._factor is None:
            K = self.dense(torch.float64)
            L = _certified_cholesky(K)
            if L is not None:
                self._factor = L
                self.rank = torch.full(K.shape[:-2], K.shape[-1], dtype=torch.long,
                                       device=K.device)
        if self._factor is None:
            evals, Q = torch.linalg.eigh(K)
            top = evals.amax(-1, keepdim=True).clamp_min(1e-300)
            # eigenvalues of K are accurate to ~eps64 * top: below that a direction is noise
            keep = evals > top * (10 * K.shape[-1] * torch.finfo(torch.float64).eps)
            inv = torch.where(keep, 1.0 / torch.where(keep, evals, torch.ones_like(evals)),
                              torch.zeros_like(evals))
            self._factor = (Q, inv)
            self.rank = keep.sum(-1)
        r64 = r.to(torch.float64)
        if isinstance(self._factor, torch.Tensor):        # certified nonsingular: Cholesky
            return torch.cholesky_solve(r64.unsqueeze(-1), self._factor).squeeze(-1).to(r.dtype)
        Q, inv = self._factor
        if r64.dim() == 2 and r64.shape[0] == Q.shape[0]:   # [B, n]: two bmm, no broadcasting
            y = inv * torch.bmm(r64.unsqueeze(-2), Q).squeeze(-2)
            return torch.bmm(Q, y.unsqueeze(-1)).squeeze(-1).to(r.dtype)
        x = Q @ (inv * (Q.transpose(-1, -2) @ r64.unsqueeze(-1)).squeeze(-1)).unsqueeze(-1)
        return x.squeeze(-1).to(r.dtype)

    def _solve_cg(self, r):
        d = self.diagonal().detach()
        minv = torch.where(d > 0, 1.0 / torch.where(d > 0, d, torch.ones_like(d)),
                           torch.ones_like(d))
        x = torch.zeros_like(r)
        res = r
        zr = minv * res
        p = zr
        rz = (res * zr).sum(-1)
        target = self.cg_tol * r.detach().norm(dim=-1)
        for k in range(self.cg_max_iter):
            Kp = self.matvec(p)
            pKp = (p * Kp).sum(-1)
            ok = pKp > 0
            alpha = torch.where(ok, rz / torch.where(ok, pKp, torch.ones_like(pKp)),
                                torch.zeros_like(pKp))
            x = x + alpha.unsqueeze(-1) * p
            res = res - alpha.unsqueeze(-1) * Kp
            self.cg_iterations = k + 1
            if bool((res.detach().norm(dim=-1) <= target).all()):
                break
            zr = minv * res
            rz_new = (res * zr).sum(-1)
            okb = rz > 0
            beta = torch.where(okb, rz_new / torch.where(okb, rz, torch.ones_like(rz)),
                               torch.zeros_like(rz))
            p = zr + beta.unsqueeze(-1) * p
            rz = rz_new
        return x
