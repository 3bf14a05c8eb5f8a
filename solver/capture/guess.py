r"""Capture-safe certification of a ``vertex_guess`` for a general LP: fixed shapes, no host sync.

The capture-safe path of :mod:`solver.capture` runs fixed-count Newton on separable LPs.  For a
general LP (dense ``A`` with equality rows: e.g. the Charnes-Cooper LPs of the ratio losses,
:mod:`objectives.fractional`) there is no such path; what runs instead is step 0 of
:func:`solver.solve_lp`: the caller's closed-form vertex, certified by one active-set solve and
the KKT check (:func:`solver.recover.recover_guess`), with every host decision replaced by a
device mask:

* ``T`` = the rows and bounds tight at the guess (to ``GUESS_TIGHT`` relative), as 0/1 weights;
* the vertex :math:`z = x - K_T^{-1} G_T^\top (G_T x - h_T)`, :math:`K_T = G_T^\top G_T`, by a
  batched float64 Cholesky (``torch.linalg.cholesky_ex``: its failure flag stays a tensor);
* the least-norm multipliers on ``T`` and the KKT measures (:func:`solver.recover._certify`);
* where some LP of the batch fails the check, :func:`~solver.recover.recover_guess`'s repair
  (rows and bounds with a negative multiplier leave ``T``, ``T`` is certified again) is taken
  for the whole batch, as there: chosen by a device mask, both computed;
* the backward is :func:`solver.implicit.active_set_output` with the same factor.

What it does not run is the eps loop that the standard path starts where a guess fails (Newton
from ``z = 0``).  Such an LP is flagged, not raised, and its result is the snapped guess:
``stats["converged"]`` (0-dim) and ``instance_stats["converged"]`` are false there, a device
tensor the caller records (:meth:`objectives.base.Objective.record_where`).  Where every LP
certifies, the standard path returns the same vertex from the same ``T`` (its host LU of the
square ``[A_T; A_eq; -I_Z]``, :mod:`solver.backends.square_active`, or the normal equations of
:mod:`solver.recover`), so vertex, value, multipliers and gradient agree to roundoff
(``tests/test_objectives_capture_f1.py``: 1e-10 in float64).

Example::

    >>> import torch
    >>> from lpmetrics.solver import solve_lp
    >>> A = torch.tensor([[1.0, 1.0]], dtype=torch.float64, requires_grad=True)
    >>> c, b = torch.tensor([-1.0, -2.0], dtype=torch.float64), torch.ones(1, dtype=torch.float64)
    >>> sol = solve_lp(c, A, b, capture_safe=True, vertex_guess=torch.tensor([0.0, 1.0]))
    >>> sol.z.sum().backward()          # no .item(), no bool(tensor) anywhere
    >>> bool(sol.stats["converged"])    # one sync, when you ask
    True
"""
from __future__ import annotations

import torch

from lpmetrics.solver.errors import LPInputError
from lpmetrics.solver.implicit import active_set_output
from lpmetrics.solver.linsolve import NewtonSystem
from lpmetrics.solver.operators import DenseOperator
from lpmetrics.solver.recover import GUESS_TIGHT, Recovery, _certify, _kkt, _tight
from lpmetrics.solver.solution import LPSolution

METHOD = "cholesky"


def check_guess_call(prob, opts) -> None:
    """What this path needs beyond :func:`solver.capture.separable.check_capture_call`'s common checks."""
    ops = [op for op in (prob.A, prob.A_eq) if op is not None]
    if not all(type(op) is DenseOperator for op in ops):
        raise LPInputError(f"capture_safe=True with a vertex_guess certifies LPs with a dense A "
                           f"(and A_eq) only; got A={prob.A!r}. Pass dense tensors or use "
                           f"capture_safe=False.")
    if opts.linear_solver not in ("auto", METHOD):
        raise LPInputError(f"capture_safe=True with a vertex_guess solves the active set by a "
                           f"dense Cholesky; linear_solver={opts.linear_solver!r} needs the host. "
                           f"Use linear_solver='auto' or capture_safe=False.")
    x = opts.vertex_guess
    if not isinstance(x, torch.Tensor) or x.shape[-1] != prob.n or \
            x.reshape(-1, prob.n).shape[0] not in (1, prob.B):
        raise LPInputError(f"vertex_guess must be a [..., {prob.n}] tensor (one point per LP of "
                           f"the batch, or one for all); got {x!r:.60}.")


class DenseActiveSystem:
    """:math:`K_T^{-1}` of a batch of active sets by a float64 Cholesky factor with no host
    check, with the interface :func:`solver.recover._certify` and
    :func:`solver.implicit.active_set_output` use.  ``ok [B]``: the factorisation succeeded
    (a singular ``K_T`` gets the identity as its factor, so every later product stays finite,
    and is flagged through ``ok``)."""

    method, pinv, factor_kind = METHOD, True, "cholesky"
    cg_iterations, cg_tol, cg_max_iter = 0, 0.0, 0
    _lu = False

    def __init__(self, prob, wA, wz, factor=None, ok=None):
        self.wA, self.wz = wA, wz
        if factor is None:
            K = NewtonSystem(prob, wA, wz, torch.zeros_like(prob.c_scale), METHOD).dense(
                torch.float64)
            L, info = torch.linalg.cholesky_ex(K)
            ok = (info == 0) & torch.isfinite(L).flatten(1).all(-1)
            eye = torch.eye(prob.n, dtype=L.dtype, device=L.device)
            factor = torch.where(ok[:, None, None], L, eye)
        self.factor, self.ok = factor, ok

    @staticmethod
    def where(cond: torch.Tensor, a: "DenseActiveSystem", b: "DenseActiveSystem"):
        """``a`` where the 0-dim bool ``cond`` holds, else ``b`` (no host read)."""
        return DenseActiveSystem(None, torch.where(cond, a.wA, b.wA), torch.where(cond, a.wz, b.wz),
                                 torch.where(cond, a.factor, b.factor), torch.where(cond, a.ok, b.ok))

    def solve(self, r: torch.Tensor) -> torch.Tensor:
        # two triangular solves (cuBLAS trsm on CUDA) rather than cholesky_solve, which may take
        # MAGMA's batched path there, not known to be graph-capturable
        L = self.factor
        r64 = r.to(torch.float64).expand(L.shape[0], L.shape[-1]).unsqueeze(-1)
        y = torch.linalg.solve_triangular(L, r64, upper=False)
        return torch.linalg.solve_triangular(L.mT, y, upper=True).squeeze(-1).to(r.dtype)


@torch.no_grad()
def certify_fixed(prob, x, tol):
    """:func:`solver.recover.recover_guess` of the guess ``x [B, n]`` (finite) with device masks
    for its host decisions; returns the :class:`~solver.recover.Recovery` and the per-LP
    ``ok`` of the factorisations it used."""
    wA, wz = _tight(prob, x, GUESS_TIGHT)
    system = DenseActiveSystem(prob, wA, wz)
    # no refinement (recover_guess's reason: the correction is itself at roundoff for an exact guess)
    z = x - system.solve(prob.normal_residual(x, wA, wz))
    cert = _certify(prob, z, system, None, tol, METHOD)
    repair = ~(_kkt(cert[3:6]) <= tol).all()
    # recover_guess's second try (taken where any LP failed): a row or bound with a negative
    # least-norm multiplier at a degenerate vertex binds in the infeasible direction only
    system2 = DenseActiveSystem(prob, wA * (cert[0] >= 0), wz * (cert[1] >= 0))
    cert2 = _certify(prob, z, system2, None, tol, METHOD)
    system = DenseActiveSystem.where(repair, system2, system)
    cert = [None if a is None else torch.where(repair, a, b) for a, b in zip(cert2, cert)]
    uA, uz, uE, primal_inf, dual_res, gap, value = cert
    return Recovery(z, system.wA, system.wz, uA, uz, uE, primal_inf, dual_res, gap, value,
                    system)


def solve_guess(prob, c, opts, finite) -> LPSolution:
    """:func:`solver.solve_lp` with ``capture_safe=True`` and a ``vertex_guess`` on a general
    LP (see the module docstring); ``finite``: the 0-dim device flag of finite data."""
    from lpmetrics.solver.capture.separable import device_stats   # (it imports this module)
    check_guess_call(prob, opts)
    x = opts.vertex_guess.detach().to(prob.dtype).reshape(-1, prob.n).expand(prob.B, prob.n)
    good = torch.isfinite(x).all(-1)
    # a non-finite guess is certified as zeros (it fails; finite arithmetic keeps the backward finite)
    x = torch.where(good.unsqueeze(-1), x, 0.0)
    rec = certify_fixed(prob, x, opts.tol)
    done = (rec.kkt <= opts.tol) & good & rec.system.ok
    zeros = torch.zeros(prob.B, dtype=torch.long, device=prob.device)
    run = {"rec": rec, "iterations": zeros, "done": done, "diverged": torch.zeros_like(done),
           "eps": torch.zeros_like(rec.gap), "eps_steps": zeros}
    z = active_set_output(prob, rec.z, rec.system)
    z_out = prob.unflatten(z, (prob.n,)).to(c.dtype)
    stats, per = device_stats(prob, run, finite, METHOD)
    return LPSolution(
        z=z_out, value=(prob.unflatten(prob.c, (prob.n,)).to(c.dtype) * z_out).sum(-1),
        dual=prob.unflatten(rec.uA, (prob.m,)).to(c.dtype),
        active=prob.unflatten(rec.wA > 0, (prob.m,)), stats=stats, instance_stats=per,
        dual_eq=None if rec.uE is None else prob.unflatten(rec.uE, (prob.p,)).to(c.dtype),
        dual_bounds=prob.unflatten(rec.uz, (prob.n,)).to(c.dtype),
        active_bounds=prob.unflatten(rec.wz > 0, (prob.n,)),
        eps=prob.unflatten(run["eps"]), penalty_z=prob.unflatten(x, (prob.n,)))
