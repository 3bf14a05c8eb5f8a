r"""Blackbox differentiation of an LP in its cost vector (Vlastelica Pogančić et al. 2020,
"Differentiation of Blackbox Combinatorial Solvers", ICLR), the CPU baseline of Meng et al. 2021 §5
("Comparing with blackbox solvers", fig. 3b): the LP is solved by HiGHS through
``scipy.optimize.linprog``, one call per instance of the batch.

For fixed data :math:`(A, b, A_{eq}, b_{eq})` the layer maps a cost vector to a vertex

.. math::

    z^*(c) = \arg\min_{z \ge 0} c^\top z \quad\text{s.t.}\quad Az \le b,\ A_{eq}z = b_{eq}.

:math:`z^*` is piecewise constant in :math:`c`, so its true Jacobian is zero almost everywhere.
Given the incoming gradient :math:`g = \partial L / \partial z` at :math:`z^*`, the backward pass
solves one more LP at the perturbed cost and returns

.. math::

    c_\lambda = c + \lambda g, \qquad z_\lambda = z^*(c_\lambda), \qquad
    \nabla_c = -\frac{1}{\lambda}\bigl(z^*(c) - z_\lambda\bigr),

the exact gradient of the piecewise-affine interpolation (Pogančić et al., §3)
:math:`f_\lambda(c) = L(z_\lambda) - \tfrac1\lambda\bigl(c^\top z^*(c) - c^\top z_\lambda\bigr)`
of the linearised loss; for a linear loss :math:`L = g^\top z` it equals
:math:`\tfrac1\lambda\bigl(h(c + \lambda g) - h(c)\bigr)` with :math:`h(c) = \min_z c^\top z`.
:math:`\lambda` trades informativeness (large: the vertex moves) against faithfulness (small:
:math:`f_\lambda \to f`; below the distance to the next vertex the gradient is exactly zero).

Deviations: the paper's solvers minimise :math:`w^\top y` over a combinatorial set; here the
"solver" is an LP with fixed constraints, which is the same setting (a linear cost over a
polytope's vertices).  Gradients flow to ``c`` only (Table 3); ``A, b`` are data.  HiGHS's
default method may run interior point with crossover, which still returns a vertex.

Example::

    >>> A = torch.tensor([[1.0, 1.0]]); b = torch.tensor([1.0])
    >>> layer = BlackboxLP(A, b, lam=10.0)
    >>> c = torch.tensor([-1.0, -0.5], requires_grad=True)
    >>> z = layer(c)                         # [1, 0]
    >>> (z * torch.tensor([1.0, -1.0])).sum().backward()   # c.grad = [-0.1, 0.1]
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp
import torch
from scipy.optimize import linprog
from torch import nn

from lpmetrics.objectives.auc import AUCLoss
from lpmetrics.objectives.common import zero_loss

# scipy's linprog status codes -> the solver's LPSolverError kinds
_STATUS = {1: "not_converged", 2: "infeasible", 3: "unbounded", 4: "not_converged"}


def _to_scipy(M, name: str):
    """A dense/sparse torch tensor, numpy array, scipy matrix or solver operator -> numpy/scipy."""
    if M is None:
        return None
    if sp.issparse(M):
        return M.tocsr()
    if isinstance(M, np.ndarray):
        return np.asarray(M, dtype=np.float64)
    if isinstance(M, torch.Tensor):
        M = M.detach().cpu()
        if M.is_sparse or M.layout != torch.strided:
            coo = M.to_sparse_coo().coalesce()
            i = coo.indices().numpy()
            return sp.csr_matrix((coo.values().double().numpy(), (i[0], i[1])), shape=tuple(M.shape))
        return M.double().numpy()
    d = getattr(M, "d", None)
    if isinstance(d, torch.Tensor) and d.dim() == 1:  # solver.DiagonalOperator
        return sp.diags(d.detach().cpu().double().numpy(), format="csr")
    if hasattr(M, "dense"):  # any other solver.LinearOperator
        return M.dense().detach().cpu().double().numpy()
    raise TypeError(f"{name} must be a tensor, numpy array, scipy sparse matrix or a solver "
                    f"LinearOperator; got {type(M)}")


class HighsLP:
    """Fixed LP data ``(A, b, A_eq, b_eq)``; :meth:`solve` maps costs ``[B, n]`` to vertices.

    ``method`` is scipy's HiGHS variant (``"highs"``, ``"highs-ds"`` dual simplex,
    ``"highs-ipm"``); one ``linprog`` call per row of ``C`` (HiGHS has no batch mode).
    """

    def __init__(self, A, b, A_eq=None, b_eq=None, method: str = "highs") -> None:
        if (A_eq is None) != (b_eq is None):
            raise ValueError("pass A_eq and b_eq together (or neither)")
        self.A = _to_scipy(A, "A")
        self.b = _to_scipy(b, "b").reshape(-1)
        self.A_eq = _to_scipy(A_eq, "A_eq")
        self.b_eq = None if b_eq is None else _to_scipy(b_eq, "b_eq").reshape(-1)
        if self.A.ndim != 2 or self.A.shape[0] != self.b.shape[0]:
            raise ValueError(f"A must be [m, n] with m = len(b) = {self.b.shape[0]}; got {self.A.shape}")
        if self.A_eq is not None and (self.A_eq.ndim != 2 or self.A_eq.shape[1] != self.A.shape[1]):
            raise ValueError(f"A_eq must be [p, {self.A.shape[1]}]; got {self.A_eq.shape}")
        self.n = self.A.shape[1]
        self.method = method
        self.calls = 0

    def solve(self, C: np.ndarray) -> np.ndarray:
        """``C [B, n]`` float64 -> optimal vertices ``[B, n]``; raises ``LPSolverError``."""
        from lpmetrics.solver.errors import LPSolverError
        C = np.asarray(C, dtype=np.float64).reshape(-1, self.n)
        Z = np.empty_like(C)
        for k, c in enumerate(C):
            res = linprog(c, A_ub=self.A, b_ub=self.b, A_eq=self.A_eq, b_eq=self.b_eq,
                          bounds=(0, None), method=self.method)
            self.calls += 1
            if res.status != 0:
                kind = _STATUS.get(res.status, "not_converged")
                raise LPSolverError(f"HiGHS: LP {k} of the batch is {kind} ({res.message}); check "
                                    "that A z <= b, A_eq z = b_eq, z >= 0 is feasible and bounded "
                                    "for the costs passed", kind=kind, instances=[k])
            Z[k] = res.x
        return Z

    def __call__(self, c: torch.Tensor) -> torch.Tensor:
        """Torch in, torch out (no gradient): ``c [..., n]`` -> ``z* [..., n]``."""
        Z = self.solve(c.detach().cpu().double().numpy())
        return torch.from_numpy(Z).reshape(c.shape).to(device=c.device, dtype=c.dtype)


class _BlackboxFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, c, lp: HighsLP, lam: float):
        z = lp(c)
        ctx.lp, ctx.lam = lp, lam
        ctx.save_for_backward(c, z)
        return z

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_z):
        c, z = ctx.saved_tensors
        z_lam = ctx.lp(c + ctx.lam * grad_z)
        return -(z - z_lam) / ctx.lam, None, None


class BlackboxLP(nn.Module):
    """LP layer ``c -> z*(c)`` with the blackbox gradient of Pogančić et al. (module docstring).

    Args:
        A, b: inequality data ``A z <= b`` (tensor, numpy, scipy sparse or solver operator).
        A_eq, b_eq: optional equality rows.
        lam: the interpolation strength :math:`\\lambda` (> 0), in units of cost per unit of
            ``dL/dz``; the paper's experiments use 10-20 on costs of order one.
        method: scipy's HiGHS variant.

    ``forward(c)``: ``c [n]`` or ``[B, n]`` -> ``z* [n]`` / ``[B, n]``, a loop of ``linprog``
    calls; the backward costs one more loop.
    """

    def __init__(self, A, b, A_eq=None, b_eq=None, *, lam: float = 10.0,
                 method: str = "highs") -> None:
        super().__init__()
        if not lam > 0:
            raise ValueError(f"lam must be > 0 (the interpolation strength); got {lam}")
        self.lp = HighsLP(A, b, A_eq, b_eq, method=method)
        self.lam = float(lam)

    def forward(self, c: torch.Tensor) -> torch.Tensor:
        if c.shape[-1] != self.lp.n or c.dim() > 2:
            raise ValueError(f"c must be [n] or [B, n] with n = {self.lp.n}; got {tuple(c.shape)}")
        return _BlackboxFn.apply(c, self.lp, self.lam)

    def extra_repr(self) -> str:
        return f"n={self.lp.n}, lam={self.lam}, method={self.lp.method!r}"


def auc_cost_lp(d: torch.Tensor, epsilon: float):
    r"""The AUC LP with the pair margins in the *cost*: the dual of the pairwise LP of
    :mod:`objectives.pairwise` (:math:`\min \mathbb 1^\top z` s.t. :math:`-z \le d - \epsilon`,
    :math:`z \ge 0`),

    .. math::

        \min_u (d - \epsilon)^\top u \quad\text{s.t.}\quad u \le \mathbb 1,\ u \ge 0,
        \qquad u^*_{ij} = \mathbb 1[d_{ij} < \epsilon],

    with the same optimal value up to sign (:math:`-\sum_{ij}\mathrm{relu}(\epsilon - d_{ij})`)
    and :math:`z^* = \mathrm{relu}(\epsilon - d) = -(d - \epsilon) \odot u^*`.  Returns
    ``(c, A, b)`` with ``A = I`` as a scipy sparse matrix (the form fig. 3b benchmarks: AUC with
    the cost vector as the parameter).
    """
    m = d.numel()
    return d - epsilon, sp.identity(m, format="csr"), np.ones(m)


class AUCBlackboxLoss(AUCLoss):
    r"""AUC through the blackbox-differentiated cost LP :func:`auc_cost_lp`:
    :math:`\mathcal L = \sum_{ij} w_{ij} u^*_{ij}` (the weighted fraction of pairs not ranked by
    margin :math:`\epsilon`; :math:`\to 1 - \mathrm{AUC}` as :math:`\epsilon \to 0`).

    The blackbox gradient moves the pairs with :math:`d_{ij} \in [\epsilon - \ell, \epsilon)`,
    each by :math:`-w_{ij}/\ell`: the gradient of a ramp of width ``lam`` :math:`= \ell` (in score
    units; the layer's :math:`\lambda` is ``lam`` / :math:`w_{ij}`, so the band does not shrink
    with the number of pairs).  With ``lam = epsilon`` it is exactly the gradient of
    :class:`objectives.auc.AUCLoss`.

    Args:
        epsilon, score, positive_class: as :class:`objectives.auc.AUCLoss`.
        lam: the interpolation width in score units (> 0).
        method: scipy's HiGHS variant.
    """

    def __init__(self, epsilon: float = 0.01, score: str = "softmax", positive_class: int = 1,
                 lam: float = 0.01, method: str = "highs") -> None:
        super().__init__(epsilon=epsilon, score=score, positive_class=positive_class)
        if not lam > 0:
            raise ValueError(f"lam must be > 0 (the interpolation width); got {lam}")
        self.lam, self.highs_method = float(lam), method

    def cost_layer(self, A, b, w: torch.Tensor) -> nn.Module:
        return BlackboxLP(A, b, lam=self.lam / float(w.max()), method=self.highs_method)

    def forward(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        pairs = self.batch_pairs(logits, labels)
        if pairs is None:
            return zero_loss(logits)
        d, w = pairs
        c, A, b = auc_cost_lp(d, self.epsilon)
        return (w * self.cost_layer(A, b, w)(c)).sum()

    def extra_repr(self) -> str:
        return f"epsilon={self.epsilon}, lam={self.lam}"
