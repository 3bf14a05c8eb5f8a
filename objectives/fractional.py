r"""Ratio metrics as linear-fractional programs, made LPs by Charnes-Cooper (Meng et al., ICLR 2021
version, §2.4, A.2; Meng et al. 2021 §3.4).

A ratio of confusion counts is, for fixed labels :math:`Y \in \{0,1\}^n`, a linear-fractional
function of the relaxed predictions :math:`\hat Y`:

.. math::

    \max_{\hat Y} \frac{a^\top \hat Y}{d^\top \hat Y + e}
    \quad\text{s.t.}\quad \phi_i \le \hat Y_i \le 1 + \phi_i,\ \ 0 \le \hat Y_i \le 1,
    \ \ [\,Y^\top\hat Y \ge \alpha\,\mathbb 1^\top Y\,],

where :math:`\phi_i = \phi(f(x_i)) \in [-1, 1]` ties the LP to the network (box constraints (c) of
the paper: with :math:`\phi_i = \pm1` they pin :math:`\hat Y_i` to the thresholded prediction).
Charnes-Cooper with :math:`t = s / (d^\top\hat Y + e)`, :math:`z = t\hat Y` (:math:`s = e` when
:math:`e > 0`, the paper's scaling that keeps :math:`t \le 1`; else :math:`s = 1`) gives the LP

.. math::

    \min_{z, t \ge 0} -\tfrac{1}{s} a^\top z
    \quad\text{s.t.}\quad d^\top z + e\,t = s,\quad z_i \le u_i t,\quad \ell_i t \le z_i,
    \quad [\,\alpha \mathbb 1^\top Y\, t - Y^\top z \le 0\,],

with :math:`u_i = \min(1, 1+\phi_i)`, :math:`\ell_i = \max(0, \phi_i)`; its optimum is
:math:`\max` of the ratio, and :math:`\hat Y = z / t`.  (The optional recall row is feasible only
if the boxes can reach recall :math:`\alpha`; :class:`objectives.ratio.PrecisionAtRecallLPLoss`
lowers :math:`\alpha` to the reachable recall when they cannot.)

**LICQ safeguard (Meng et al. 2021, remark 2).**  The paper's rows
:math:`z_i \le t,\ \phi_i t \le z_i,\ z_i \le (1+\phi_i)t` plus :math:`z \ge 0` are redundant in
pairs (for :math:`\phi_i \ge 0` the third is implied by the first, for :math:`\phi_i < 0` the second
by :math:`z_i \ge 0`), so the gradients of the active constraints are linearly dependent at the
optimum and the active-set system is singular.  ``safeguard="drop_redundant"`` (default) keeps
exactly one upper row :math:`z_i - u_i t \le 0` per sample and a lower row
:math:`\ell_i t - z_i \le 0` only where :math:`\ell_i > 0`; these define the same feasible set with
the same derivatives almost everywhere (:math:`u, \ell` are the piecewise-linear envelopes of
:math:`\phi`); the losses also keep :math:`\phi` inside :math:`[-1 + 10^{-6}, 1 - 10^{-6}]` so a
saturated score cannot pin :math:`\hat Y_i` with two active rows.  Every sample then has exactly
one active row at a vertex (generically), plus the normalisation: :math:`n + 1` independent rows
for :math:`n + 1` variables, so the active-set system of the backward is square and nonsingular.  ``safeguard="none"`` builds the paper's 3n rows, for comparison.

Example::

    >>> lp = charnes_cooper_lp(num=2 * y, den=torch.ones_like(y), den0=y.sum(), phi=phi)
    >>> sol = solve_lp(lp.c, lp.A, lp.b, lp.A_eq, lp.b_eq); value = lp.value(sol.z)
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from lpmetrics.solver.arrays import NUMPY, NUMPY_IEEE, TORCH

SAFEGUARDS = ("drop_redundant", "none")
SENSES = ("max", "min")


@dataclass
class FractionalLP:
    """``min c^T x  s.t.  A x <= b, A_eq x = b_eq, x >= 0`` with ``x = [z (n), t]``."""

    c: torch.Tensor
    A: torch.Tensor
    b: torch.Tensor
    A_eq: torch.Tensor
    b_eq: torch.Tensor
    n: int
    sign: torch.Tensor | float = 1.0
    guess: torch.Tensor | None = None   # the optimal vertex when the boxes alone bind


    def value(self, x: torch.Tensor) -> torch.Tensor:
        """The ratio at an LP point ``x``: ``-sign * c^T x`` (``sign`` +1 for a maximised ratio,
        -1 for a minimised one; ``[k]`` when ``c`` stacks ``k`` LPs over the same rows)."""
        if x.dim() == 1 and isinstance(self.sign, float):     # one LP: one graph node
            return torch.dot(-self.sign * self.c, x)
        return -self.sign * (self.c * x).sum(-1)

    def predictions(self, x: torch.Tensor) -> torch.Tensor:
        """The relaxed predictions ``Y_hat = z / t``."""
        return x[..., : self.n] / x[..., self.n: self.n + 1].clamp_min(1e-12)


def box_bounds(phi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(l, u)`` with ``l = max(0, phi)``, ``u = min(1, 1 + phi)``: the boxes of constraint (c)."""
    return torch.relu(phi), 1.0 - torch.relu(-phi)


def charnes_cooper_lp(num: torch.Tensor, den: torch.Tensor, den0: float | torch.Tensor,
                      phi: torch.Tensor, *, recall_rows: tuple[torch.Tensor, float] | None = None,
                      safeguard: str = "drop_redundant",
                      senses: tuple[str, ...] = ("max",), static: bool = False) -> FractionalLP:
    """Build the LP of the module docstring for ``max (num^T Y) / (den^T Y + den0)``.

    ``recall_rows = (y, alpha)`` adds the constraint ``y^T Y_hat >= alpha * sum(y)``.
    ``phi`` carries the gradient; ``num``, ``den``, ``den0`` depend on the labels only.
    ``senses`` lists ``"max"`` (the upper bound) and/or ``"min"`` (the lower bound, same rows,
    negated cost); with two, ``c`` is ``[2, n + 1]``: a batch of two LPs sharing ``A``.

    ``static``: the same LP with shapes fixed by ``n`` alone and no value read on the host (the
    capture-safe form of the ratio losses, :meth:`objectives.ratio.RatioLPLoss.capture_safe_form`):
    ``den0`` stays a tensor, and ``drop_redundant`` keeps a lower row for every sample, the
    dropped ones as ``-z_i <= s``, slack by at least ``s`` wherever ``z >= 0`` (never tight, so
    never in the active set; ``|b|_inf`` is still ``s``, so are the solver's scales) with a
    zero ``t`` entry; the guess is computed by torch without an early exit.
    """
    if safeguard not in SAFEGUARDS:
        raise ValueError(f"safeguard must be one of {SAFEGUARDS}; got {safeguard!r}")
    if not senses or any(sense not in SENSES for sense in senses):
        raise ValueError(f"senses must be a non-empty tuple of {SENSES}; got {senses!r}")
    n = phi.shape[0]
    dt, dev = phi.dtype, phi.device
    num, den = (t if t.dtype == dt else t.to(dt) for t in (num, den))
    if static:   # (a fill, not a host-to-device copy, for a Python den0: graph capture allows it)
        den0 = den0.to(dt) if isinstance(den0, torch.Tensor) else \
            torch.full((), float(den0), dtype=dt, device=dev)
        s = torch.where(den0 > 0, den0, 1.0)
    else:
        den0 = float(den0)
        s = den0 if den0 > 0 else 1.0
    eye, neg_eye = _identities(n, dt, dev)
    with torch.no_grad():           # for the rows kept and the guess; A takes phi below
        lo, up = box_bounds(phi)
    b = None

    # (few torch ops: at n ~ 64 each op's dispatch, not its arithmetic, is the cost)
    if safeguard == "drop_redundant" and static:
        const = torch.cat([eye, neg_eye])
        col = torch.cat([torch.relu(-phi) - 1.0, torch.where(lo > 0, phi, 0.0)])
        b = torch.cat([torch.zeros_like(phi), torch.where(lo > 0, 0.0, s)])
    elif safeguard == "drop_redundant":
        keep = torch.from_numpy(np.flatnonzero(lo.numpy() > 0)) if dev.type == "cpu" else \
            (lo > 0).nonzero().flatten()
        # rows [I, -u] then [-I_keep, l_keep]: the constant block, and the column of t, written
        # with few graph nodes: -u = relu(-phi) - 1 and l = phi where l > 0 (same values and
        # derivatives as box_bounds')
        const = torch.cat([eye, neg_eye.index_select(0, keep)])
        col = torch.cat([torch.relu(-phi) - 1.0, phi.index_select(0, keep)])
    else:  # the paper's rows: z <= t, phi t <= z, z <= (1 + phi) t
        const = torch.cat([eye, neg_eye, eye])
        col = torch.cat([-torch.ones_like(phi), phi, -(1.0 + phi)])
    A = torch.cat([const, col[:, None]], 1)
    if recall_rows is not None:
        y, alpha = recall_rows
        y = y.to(dt)
        A = torch.cat([A, torch.cat([-y, (alpha * y.sum()).reshape(1)])[None, :]], 0)
    c_max = torch.nn.functional.pad(-num / s, (0, 1))
    if len(senses) == 1:
        sign = 1.0 if senses[0] == "max" else -1.0
        c = c_max if sign > 0 else -c_max
    elif static:    # (fills: torch.tensor of a list would be a host-to-device copy)
        sign = torch.stack([torch.full((), 1.0 if sense == "max" else -1.0, dtype=dt, device=dev)
                            for sense in senses])
        c = sign[:, None] * c_max
    else:
        sign = torch.tensor([1.0 if sense == "max" else -1.0 for sense in senses], dtype=dt,
                            device=dev)
        c = sign[:, None] * c_max
    with torch.no_grad():
        guess = [box_vertex(num, den, den0, s, phi, sense, bounds=(lo, up), static=static)
                 for sense in senses]
    rows = torch.zeros(A.shape[0] - (0 if b is None else b.shape[0]), dtype=dt, device=dev)
    if static:
        A_eq, b_eq = torch.cat([den, den0.reshape(1)])[None, :], s.reshape(1)
    else:
        A_eq = torch.nn.functional.pad(den, (0, 1), value=den0)[None, :]
        b_eq = torch.full((1,), s, dtype=dt, device=dev)
    return FractionalLP(c=c, A=A, b=rows if b is None else torch.cat([b, rows]), A_eq=A_eq,
                        b_eq=b_eq, n=n, sign=sign,
                        guess=guess[0] if len(senses) == 1 else torch.stack(guess))


_IDENTITIES: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def _identities(n: int, dtype: torch.dtype, device: torch.device):
    """``(I_n, -I_n)``, made once per size, dtype and device (a training loop solves LPs of one
    or two sizes; read only: every use copies them into a new matrix)."""
    key = (n, dtype, device)
    out = _IDENTITIES.get(key)
    if out is None:
        with torch.inference_mode(False):      # (normal tensors, as in ratio._half_diff)
            eye = torch.eye(n, dtype=dtype, device=device)
            out = (eye, -eye)
        if n <= 1024 and len(_IDENTITIES) < 8:      # (at most 8 x 2 x 8 MiB)
            _IDENTITIES[key] = out
    return out


def box_vertex(num, den, den0, s, phi, sense="max", rounds=3, bounds=None, static=False):
    r"""The optimum ``x = [t \hat Y, t]`` of the LP without the recall row, by Dinkelbach's
    rule: at the optimal ratio :math:`R`, :math:`\hat Y_i` sits at the top of its box where
    :math:`a_i - R d_i > 0` (``"max"``; ``< 0`` for ``"min"``) and at the bottom elsewhere; from
    the guess "top where :math:`a_i > 0`" the pattern settles in one or two rounds.  A guess
    for :func:`solver.solve_lp`'s ``vertex_guess``, which certifies it (with the recall row it
    may be infeasible or not optimal: the solver then runs Newton).  ``bounds``: the boxes
    ``(l, u)`` of ``phi`` when the caller has them.  On the CPU the ~15 vector ops run in numpy,
    whose dispatch costs a fraction of torch's at n ~ 64 (the same arithmetic).  ``static``:
    torch on every device, all ``rounds`` run (no host read; a settled pattern is a fixed point
    of a round, so the result is the same)."""
    lo, up = box_bounds(phi) if bounds is None else bounds
    lo, up = lo.detach(), up.detach()
    if static:
        return _box_vertex(TORCH, num, den, den0, s, lo, up, sense, rounds, static=True)
    if lo.device.type == "cpu" and not (num.requires_grad or den.requires_grad):
        args = (num.numpy(), den.numpy(), den0, s, lo.numpy(), up.numpy(), sense, rounds)
        try:
            x = _box_vertex(NUMPY, *args)
        except ZeroDivisionError:
            # a denominator that vanishes on a box vertex (e.g. P@R's with nothing predicted
            # positive): IEEE's inf / NaN as in torch, which warns about nothing; the solver
            # ignores a non-finite guess (solver.solve.run_from_guess)
            with np.errstate(divide="ignore", invalid="ignore"):
                x = _box_vertex(NUMPY_IEEE, *args)
        return torch.from_numpy(x)
    return _box_vertex(TORCH, num, den, den0, s, lo, up, sense, rounds)


def _box_vertex(xp, num, den, den0, s, lo, up, sense, rounds, static=False):
    top = num > 0 if sense == "max" else num < 0
    settled = False
    for _ in range(rounds):
        yh = xp.where(top, up, lo)
        dy = xp.dot(den, yh) + den0
        gain = num - xp.div(xp.dot(num, yh), dy) * den
        new = gain > 0 if sense == "max" else gain < 0
        settled = not static and xp.equal(new, top)
        if settled:
            break
        top = new
    if not settled:
        yh = xp.where(top, up, lo)
        dy = xp.dot(den, yh) + den0
    t = xp.div(s, dy)
    return xp.cat([t * yh, t.reshape(1)])
