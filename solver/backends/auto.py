"""``forward="auto"`` and ``max_seconds``: which forward serves a call, and the time-limit error.

``"auto"`` (the default) keeps Newton wherever HiGHS cannot take over -- structured operators,
separable LPs, GPU data, ``backward="unrolled"``, sketches -- and elsewhere (a general LP on the
CPU) runs Newton with a hand-off to HiGHS (:func:`solver.solve._newton_forward`), or HiGHS at
once for a large one.  Why n >= ``SPARSE_MIN_N`` counts as large: on the random sparse LPs of
``results/solver/`` Newton took 17-564x HiGHS's forward from n = 500 on, while
``forward="highs"`` with our backward took 1.5-2x.
"""
from __future__ import annotations

import torch

from lpmetrics.solver.errors import LPTimeLimitError
from lpmetrics.solver.linsolve import SPARSE_MIN_N


# forward="auto": share of max_seconds that Newton may spend before a hand-off to HiGHS
AUTO_NEWTON_SHARE = 0.5


def route(c, A, A_eq, opts, backward) -> str:
    """``"newton"``, ``"highs"`` or ``"auto"`` (Newton with a hand-off to HiGHS) for this call.

    ``forward="auto"`` means HiGHS may serve the call only where it can: a general LP (``A``
    and ``A_eq`` dense or ``torch.sparse`` tensors, not structured operators) on the CPU with
    the active-set backward and no sketch.  Such an LP with ``n >= SPARSE_MIN_N`` and no
    ``vertex_guess``/``warm_start`` goes to HiGHS at once (large: see
    :class:`solver.options.SolverOptions`); a smaller one runs Newton with the hand-off."""
    if opts.forward != "auto":
        return opts.forward
    mats = [M for M in (A, A_eq) if M is not None]
    general = all(isinstance(M, torch.Tensor) for M in mats)
    if not (general and c.device.type == "cpu" and backward == "active_set"
            and opts.sketch is None):
        return "newton"
    if (c.shape[-1] >= SPARSE_MIN_N and opts.vertex_guess is None
            and opts.warm_start is None):
        return "highs"
    return "auto"


def time_limit_error(opts, run, stats):
    bad = (~run["done"]).nonzero().flatten().tolist()
    where = f"batch instances {bad[:10]}{'...' if len(bad) > 10 else ''}"
    return LPTimeLimitError(
        f"LP solve ran past max_seconds={opts.max_seconds:g} ({stats['seconds']:.2f} s) "
        f"before converging ({where}): KKT residual {stats['kkt_residual']:.2e} > "
        f"tol={opts.tol:.1e} (primal infeasibility {stats['primal_infeasibility']:.1e}, dual "
        f"residual {stats['dual_residual']:.1e}, duality gap {stats['duality_gap']:.1e}) "
        f"after {stats['iterations']} Newton steps and {stats['eps_steps']} eps reductions "
        f"(eps {stats['eps']:.1e}). Try forward='highs' (or the default forward='auto') for a "
        f"general LP on the CPU, a larger max_seconds (None: no bound), "
        f"compute_dtype=torch.float64 for float32 data, or rescaling the rows of A.",
        stats=stats, instances=bad)
