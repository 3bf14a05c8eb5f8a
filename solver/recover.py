r"""Multipliers by thresholding, primal vertex by one linear solve, KKT check.

At the penalty minimiser :math:`z_\varepsilon` the scaled residuals
:math:`u = \|c\|_\infty (\text{residual})_+/\varepsilon` are dual feasible and, for
:math:`\varepsilon \le \bar\varepsilon`, the least 2-norm dual solution (Mangasarian 2004, JOTA
121, Thm. 2.1; Meng et al. 2021, sec. 4.2).  Complementary slackness then says every primal solution
satisfies the rows with :math:`u_i > 0` with equality.  Rows that are (nearly) tight at
:math:`z_\varepsilon` -- residual above :math:`-\kappa`, :math:`\kappa =` ``active_tol`` ``*
eps * max(1, |u|_inf)`` -- form the active set ``T``; it contains every row with a positive
multiplier and, at a degenerate vertex, the tight rows with zero multiplier too.

The primal is the minimum-norm correction of :math:`z_\varepsilon` onto
:math:`\{z: G_T z = h_T\}` (least squares if the rows are inconsistent):
:math:`z^* = z_\varepsilon - K_T^{+} G_T^\top (G_T z_\varepsilon - h_T)`,
:math:`K_T = G_T^\top G_T`, with one refinement step.  If ``G_T`` has full column rank this is
the vertex itself (independent of :math:`z_\varepsilon`, no ridge bias); if not, it is the point
of the optimal face closest to :math:`z_\varepsilon`.

The multipliers are either the thresholded ones or the least-norm solution of
:math:`G_T^\top u_T = -c`, :math:`u_T = -G_T K_T^{+} c` (free of the :math:`1/\varepsilon`
roundoff amplification; one more solve with the same factorisation), whichever certifies
better.  The result is accepted when the KKT conditions hold to ``tol``: primal feasibility of
:math:`z^*`, dual feasibility (stationarity and :math:`u \ge 0`) and a zero duality gap (which
with feasibility implies complementarity).  Otherwise the caller decreases
:math:`\varepsilon` (Mangasarian's rule).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from lpmetrics.solver.arrays import TORCH
from lpmetrics.solver.linsolve import NewtonSystem


@dataclass
class Recovery:
    z: torch.Tensor          # [B, n] recovered primal (detached)
    wA: torch.Tensor         # [B, m] 0/1 active inequality rows
    wz: torch.Tensor         # [B, n] 0/1 active bounds z_j = 0
    uA: torch.Tensor         # [B, m] multipliers of A z <= b
    uz: torch.Tensor         # [B, n] multipliers of z >= 0
    uE: torch.Tensor | None  # [B, p] multipliers of the equalities
    primal_inf: torch.Tensor  # [B]
    dual_res: torch.Tensor    # [B]
    gap: torch.Tensor         # [B]
    value: torch.Tensor       # [B]
    system: NewtonSystem      # K_T with its factorisation (reused by the backward)

    @property
    def kkt(self):
        cached = self.__dict__.get("_kkt_value")
        if cached is None:      # fields are not modified after construction
            cached = self.__dict__["_kkt_value"] = _kkt((self.primal_inf, self.dual_res,
                                                         self.gap))
        return cached


@torch.no_grad()
def multipliers(prob, zp, eps):
    rA, rE = prob.residuals(zp)
    s = (prob.c_scale / eps).unsqueeze(-1)
    uA = s * rA.clamp_min(0)
    uz = s * (-zp).clamp_min(0)
    uE = None if rE is None else s * rE
    return rA, rE, uA, uz, uE


@torch.no_grad()
def primal_measures(prob, z):
    """The parts of :func:`kkt_measures` that depend on ``z`` alone (:func:`primal_terms`): one
    computation for every multiplier candidate of the same ``z`` (:func:`_certify`)."""
    rA, rE = prob.residuals(z)
    return primal_terms(TORCH, z, rA, rE, prob.c, prob.h_scale, prob.c_norm)


@torch.no_grad()
def kkt_measures(prob, z, uA, uz, uE, primal=None):
    """``(primal_inf, dual_res, gap, value)`` of ``z`` with multipliers ``(uA, uz, uE)``;
    ``primal``: :func:`primal_measures` of this ``z`` when the caller has it."""
    if primal is None:
        primal = primal_measures(prob, z)
    stat = prob.c + prob.A.rmatvec(uA) - uz
    if uE is not None:
        stat = stat + prob.A_eq.rmatvec(uE)
    return kkt_terms(TORCH, z, uA, uz, uE, None, None, stat, prob.c, prob.b, prob.b_eq,
                     prob.h_scale, prob.c_norm, primal=primal)


def primal_terms(xp, z, rA, rE, c, h_scale, c_norm):
    """``(primal_inf, value, gap_scale)``: the terms of :func:`kkt_terms` that do not depend on
    the multipliers."""
    # max(0, max_i rA_i, max_j -z_j) in one reduction
    inf = xp.clip0(xp.amax(xp.cat([rA, -z], -1), -1)) + 0.0   # + 0.0: no -0.0
    if rE is not None:
        inf = xp.maximum(inf, xp.amax(abs(rE), -1))
    value = (c * z).sum(-1)
    # the gap is scaled by the size of the terms that cancel in it
    return inf / h_scale, value, 1 + abs(value) + c_norm * xp.amax(abs(z), -1)


def kkt_terms(xp, z, uA, uz, uE, rA, rE, stat, c, b, b_eq, h_scale, c_norm, primal=None):
    """``(primal_inf, dual_res, gap, value)`` from the residuals ``rA = A z - b``,
    ``rE = A_eq z - b_eq`` and the stationarity residual ``stat = c + A^T uA - uz + A_eq^T uE``;
    ``xp``: ``TORCH`` or ``NUMPY`` (:mod:`solver.backends.square_active` certifies on the host);
    ``primal``: :func:`primal_terms` of this ``z`` (then ``rA``, ``rE`` are not read)."""
    primal_inf, value, gap_scale = primal if primal is not None else \
        primal_terms(xp, z, rA, rE, c, h_scale, c_norm)
    dual_obj = -(b * uA).sum(-1)
    if uE is not None:
        dual_obj = dual_obj - (b_eq * uE).sum(-1)
    # max(0, max_i -uA_i, max_j -uz_j) in one reduction
    neg = xp.clip0(-xp.amin(xp.cat([uA, uz], -1), -1)) + 0.0
    dual_res = xp.maximum(xp.amax(abs(stat), -1), neg) / (1 + c_norm)
    gap = abs(value - dual_obj) / gap_scale
    return primal_inf, dual_res, gap, value


def _solve_active(prob, zp, wA, wz, method, cg_tol, cg_max_iter, refine=2):
    system = NewtonSystem(prob, wA, wz, torch.zeros_like(prob.c_scale), method, pinv=True,
                          cg_tol=cg_tol, cg_max_iter=cg_max_iter)
    z = zp - system.solve(prob.normal_residual(zp, wA, wz))
    if system._lu:            # square active rows by LU (solver.backends.active_lu): backward stable
        refine = min(refine, 1)
    if method != "diagonal":  # iterative refinement (normal equations; diagonal: exact)
        for _ in range(refine):
            z = z - system.solve(prob.normal_residual(z, wA, wz))
    return z, system


def _least_norm_dual(prob, system):
    """``u_T = -G_T K_T^+ c``: least-norm solution of ``G_T^T u_T = -c`` on the rows of T."""
    q = system.solve(prob.c.detach())
    uA, uz = -system.wA * prob.A.matvec(q), system.wz * q
    uE = None if prob.A_eq is None else -prob.A_eq.matvec(q)
    return uA, uz, uE


def _kkt(m, xp=TORCH):
    """One KKT number.  In float64 primal feasibility counts 100x: the active-set solve makes
    the right vertex feasible to roundoff, while on an ill-conditioned LP a wrong vertex can be
    feasible to ~1e-8 with a near-zero gap.  (``xp``: torch or numpy.)"""
    weight = 100.0 if m[0].dtype in (torch.float64, np.float64) else 1.0
    return xp.maximum(xp.maximum(weight * m[0], m[1]), m[2])


class PenaltyDuals:
    """The penalty multipliers ``u = (uA, uz, uE)`` of one recovery, and the least-norm
    multipliers on the rows and bounds where they are positive (:func:`_certify`'s third
    candidate), made on first use and then kept: they do not depend on the vertex, so the
    repair rounds' vertices reuse them."""

    def __init__(self, prob, u, method, cg_tol, cg_max_iter):
        self.prob, self.u, self.method = prob, u, method
        self.cg_tol, self.cg_max_iter = cg_tol, cg_max_iter
        self._least_norm = None

    def least_norm(self):
        if self._least_norm is None:
            uA, uz, _ = self.u
            self._least_norm = _least_norm_dual(self.prob, NewtonSystem(
                self.prob, (uA > 0).to(uA.dtype), (uz > 0).to(uz.dtype),
                torch.zeros_like(self.prob.c_scale), self.method, pinv=True,
                cg_tol=self.cg_tol, cg_max_iter=self.cg_max_iter))
        return self._least_norm


def _certify(prob, z, system, pen_u, accept_tol, method, fixed=False):
    """Multipliers and KKT measures for ``z``.  Candidates, first that passes wins (else the
    best): least-norm multipliers on the active rows ``T`` (no 1/eps roundoff
    amplification); the thresholded penalty multipliers; least-norm multipliers on the rows
    with positive penalty multipliers only (a degenerate vertex has more tight rows than
    the dual needs, and the least-norm fit over all of them can go negative).  ``pen_u``
    None: the first candidate only (a guessed vertex has no penalty multipliers); else a
    :class:`PenaltyDuals`, which keeps the third candidate across the vertices it is tried on.
    ``fixed`` (:mod:`solver.capture`): every candidate is computed and the "stop once the whole
    batch passes" test is a device mask instead of a host branch (same result)."""
    u = _least_norm_dual(prob, system)
    primal = primal_measures(prob, z)   # the same z for every candidate
    best = [*u, *kkt_measures(prob, z, *u, primal=primal)]
    best_kkt = _kkt(best[3:6])
    candidates = [] if pen_u is None else [lambda: pen_u.u, pen_u.least_norm]
    for make in candidates:
        passed = (best_kkt <= accept_tol).all()
        if not fixed and bool(passed):
            break
        u = make()
        cand = [*u, *kkt_measures(prob, z, *u, primal=primal)]
        kkt = _kkt(cand[3:6])
        use = kkt < best_kkt
        if fixed:
            use = use & ~passed
        best = [a if a is b else _where(use, a, b) for a, b in zip(cand, best)]   # (primal_inf, value: shared)
        best_kkt = torch.where(use, kkt, best_kkt)
    return best


def _where(mask, a, b):
    if a is None:
        return None
    return torch.where(mask.view(-1, *([1] * (a.dim() - 1))), a, b)


@torch.no_grad()
def recover(prob, zp, eps, *, method, active_tol=1.0, cg_tol=1e-12, cg_max_iter=1000,
            accept_tol=0.0, repair_rounds=2, fixed=False):
    """Active set at ``zp``, vertex, multipliers, KKT measures (see the module docstring).

    Where the active rows are inconsistent (``eps`` above the exactness threshold for a few
    nearly degenerate rows, common in huge separable LPs) the least-squares point violates
    some active rows and strictly satisfies others; up to ``repair_rounds`` times the strictly
    satisfied ones are dropped and the vertex re-solved, kept only if the KKT residual drops.

    ``fixed=True`` (:mod:`solver.capture`, no host sync): every repair round runs, and the
    rounds the standard path would have skipped (nothing bad, the same T, no LP improved) are
    masked out on the device by ``go``, so the result is the same.
    """
    zp = zp.detach()
    rA, _, uA, uz, uE = multipliers(prob, zp, eps)
    umax = torch.maximum(uA.amax(-1) if prob.m else torch.zeros_like(eps), uz.amax(-1))
    kappa = (active_tol * eps * (umax / prob.c_scale).clamp_min(1.0)).unsqueeze(-1)
    wA = (rA > -kappa).to(zp.dtype)
    wz = (zp < kappa).to(zp.dtype)
    z, system = _solve_active(prob, zp, wA, wz, method, cg_tol, cg_max_iter)
    pen = PenaltyDuals(prob, (uA, uz, uE), method, cg_tol, cg_max_iter)
    cert = _certify(prob, z, system, pen, accept_tol, method, fixed)
    mixed = False
    go = torch.ones((), dtype=torch.bool, device=zp.device)   # fixed: "the loop goes on"
    for _ in range(repair_rounds):
        kkt = _kkt(cert[3:6])
        # also repair accepted points whose few ambiguous rows leave a visible infeasibility
        bad = (kkt > accept_tol) | (cert[3] > 100 * torch.finfo(z.dtype).eps)
        if fixed:
            go = go & bad.any()
        elif not bool(bad.any()):
            break
        rA, _ = prob.residuals(z)
        size = torch.maximum((wA * rA).abs().amax(-1) if prob.m else torch.zeros_like(eps),
                             (wz * z).abs().amax(-1))
        thr = (1e-3 * size).unsqueeze(-1)
        wA2 = torch.where(bad.unsqueeze(-1), wA * (rA >= -thr), wA)
        wz2 = torch.where(bad.unsqueeze(-1), wz * (z <= thr), wz)
        if fixed:
            go = go & ~((wA2 == wA).all() & (wz2 == wz).all())
        elif torch.equal(wA2, wA) and torch.equal(wz2, wz):
            break
        z2, system2 = _solve_active(prob, zp, wA2, wz2, method, cg_tol, cg_max_iter)
        cert2 = _certify(prob, z2, system2, pen, accept_tol, method, fixed)
        kkt2 = _kkt(cert2[3:6])
        better = kkt2 < kkt
        if fixed:   # all better: take all; none: stop; some: take those (_finish rebuilds K_T)
            take = go & better
            z, wA, wz = _where(take, z2, z), _where(take, wA2, wA), _where(take, wz2, wz)
            cert = [_where(take, a, b) for a, b in zip(cert2, cert)]
            go = go & better.any()
            continue
        if bool(better.all()):
            z, wA, wz, system, cert = z2, wA2, wz2, system2, cert2
            continue
        if not bool(better.any()):
            break
        z, wA, wz = _where(better, z2, z), _where(better, wA2, wA), _where(better, wz2, wz)
        cert = [_where(better, a, b) for a, b in zip(cert2, cert)]
        mixed = True
    return _finish(prob, z, wA, wz, system, cert, mixed or fixed, method, cg_tol, cg_max_iter)


def _tight(prob, z, rel=None):
    """0/1 weights of the rows and bounds tight at ``z`` (to ``rel`` * scale; default
    sqrt(machine eps), an external solver's feasibility tolerance)."""
    rel = torch.finfo(z.dtype).eps ** 0.5 if rel is None else rel
    rA, _ = prob.residuals(z)
    tA, tz = tight_masks(rA, z, prob.h_scale, rel)
    return tA.to(z.dtype), tz.to(z.dtype)


def tight_masks(rA, z, h_scale, rel):
    """Boolean masks of the rows (residuals ``rA``) and bounds tight at ``z`` to ``rel *
    h_scale``; torch or numpy arrays."""
    thr = (rel * h_scale)[..., None]
    return rA >= -thr, z <= thr


def _finish(prob, z, wA, wz, system, cert, rebuild, method, cg_tol, cg_max_iter):
    """The KKT check certifies ``z`` whatever T was; keep in T only the rows tight at z (a
    spurious row in an inconsistent least-squares fit would corrupt the backward).
    ``rebuild``: K_T is rebuilt without comparing (no host sync); it is a function of the final
    ``(wA, wz)``, so it equals the system it replaces where those did not change."""
    tA, tz = _tight(prob, z)
    wA2, wz2 = wA * tA, wz * tz
    if rebuild or not torch.equal(wA2, wA) or not torch.equal(wz2, wz):
        wA, wz = wA2, wz2
        system = NewtonSystem(prob, wA, wz, torch.zeros_like(prob.c_scale), method, pinv=True,
                              cg_tol=cg_tol, cg_max_iter=cg_max_iter)
    uA, uz, uE, primal_inf, dual_res, gap, value = cert
    return Recovery(z, wA, wz, uA, uz, uE, primal_inf, dual_res, gap, value, system)


@torch.no_grad()
def recover_vertex(prob, x, u, *, method, cg_tol=1e-12, cg_max_iter=1000, accept_tol=0.0):
    """Recovery from an external solver's optimal vertex ``x [B, n]`` and its multipliers
    ``u = (uA, uz, uE)`` (``forward="highs"``): T = the rows and bounds tight at ``x``; the
    same active-set solve as :func:`recover` snaps ``x`` onto ``{G_T z = h_T}`` (the vertex to
    roundoff; the external solver stops at its own feasibility tolerance), and the same
    certificate picks the multipliers (least-norm on T first, so ``dual`` matches Newton's).
    Where the snapped point certifies worse than ``x`` itself, ``x`` is kept."""
    x = x.detach()
    wA, wz = _tight(prob, x)
    z, system = _solve_active(prob, x, wA, wz, method, cg_tol, cg_max_iter)
    pen = PenaltyDuals(prob, u, method, cg_tol, cg_max_iter)   # (shared by both certificates)
    cert = _certify(prob, z, system, pen, accept_tol, method)
    worse = _kkt(cert[3:6]) > accept_tol
    if bool(worse.any()):
        cert_x = _certify(prob, x, system, pen, accept_tol, method)
        use_x = worse & (_kkt(cert_x[3:6]) < _kkt(cert[3:6]))
        z = _where(use_x, x, z)
        cert = [_where(use_x, a, b) for a, b in zip(cert_x, cert)]
    return _finish(prob, z, wA, wz, system, cert, False, method, cg_tol, cg_max_iter)


# a guessed vertex is exact to roundoff: its tight rows have residuals ~ eps * scale, while a
# nearly tight row that is not active (a box of width 1e-6, objectives/ratio.py's PHI_MARGIN)
# can have a slack near sqrt(eps) * scale, the tolerance _tight uses for external solvers
GUESS_TIGHT = 1e-11


@torch.no_grad()
def recover_guess(prob, x, *, method, cg_tol=1e-12, cg_max_iter=1000, accept_tol=0.0):
    """Certify a guessed vertex ``x [B, n]`` (``vertex_guess``): T = the rows and bounds tight
    at ``x`` (to ``GUESS_TIGHT`` relative), the active-set solve snaps ``x`` onto
    ``{G_T z = h_T}`` and the least-norm multipliers on T certify it.  The caller accepts the
    LPs whose KKT residual is below ``accept_tol`` and runs Newton on the others."""
    x = x.detach()
    wA, wz = _tight(prob, x, GUESS_TIGHT)
    # no refinement: the correction K_T^+ F(x) is itself at roundoff for an exact guess (its
    # error is cond(K_T) eps times that), and a guess that is off fails the KKT check
    z, system = _solve_active(prob, x, wA, wz, method, cg_tol, cg_max_iter, refine=0)
    cert = _certify(prob, z, system, None, accept_tol, method)
    if not bool((_kkt(cert[3:6]) <= accept_tol).all()):
        # a degenerate vertex (more tight rows than variables, e.g. P@R's recall row at the
        # reachable recall): the least-norm fit over all of T can give a row a negative
        # multiplier.  Such a row only binds in the infeasible direction, so it leaves T (as
        # the eps loop's T leaves it: same vertex, same backward) and T is certified again
        wA = wA * (cert[0] >= 0)
        wz = wz * (cert[1] >= 0)
        system = NewtonSystem(prob, wA, wz, torch.zeros_like(prob.c_scale), method, pinv=True,
                              cg_tol=cg_tol, cg_max_iter=cg_max_iter)
        cert = _certify(prob, z, system, None, accept_tol, method)
    uA, uz, uE, primal_inf, dual_res, gap, value = cert
    # T needs no pruning (_finish): its rows are tight at z to roundoff, far inside _tight's
    # sqrt(eps) tolerance, so _finish would keep every one of them
    return Recovery(z, wA, wz, uA, uz, uE, primal_inf, dual_res, gap, value, system)
