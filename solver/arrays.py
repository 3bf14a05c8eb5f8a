"""The few array operations written once for torch tensors and numpy arrays (``xp``).

Some small computations run on the host in numpy where that is cheaper (a numpy op on a vector
of ~64 entries costs a fraction of a torch dispatch) and in torch elsewhere (GPU, autograd):
the KKT measures of a vertex (:func:`solver.recover.kkt_terms`, certified in numpy by
:mod:`solver.backends.square_active`) and the closed-form vertex of the ratio LPs
(:func:`objectives.fractional.box_vertex`).  The function takes ``xp = TORCH`` or ``NUMPY``
and calls these, so the arithmetic is written once and is the same on both.
"""
from __future__ import annotations

import numpy as np
import torch


class TORCH:
    maximum, cat, where, dot = (staticmethod(f) for f in (torch.maximum, torch.cat,
                                                          torch.where, torch.dot))
    amax, amin, equal = staticmethod(torch.amax), staticmethod(torch.amin), staticmethod(torch.equal)
    clip0 = staticmethod(lambda x: x.clamp_min(0))
    div = staticmethod(lambda a, b: a / b)


class NUMPY:
    maximum, cat, where, dot = (staticmethod(f) for f in (np.maximum, np.concatenate,
                                                          np.where, np.dot))
    # (the array methods: numpy's module-level reductions add a Python-level wrapper)
    amax = staticmethod(lambda x, axis: x.max(axis))
    amin = staticmethod(lambda x, axis: x.min(axis))
    equal = staticmethod(lambda a, b: bool((a == b).all()))   # (np.array_equal: 5x slower)
    clip0 = staticmethod(lambda x: np.maximum(x, 0.0))
    div = staticmethod(lambda a, b: a / b if b else _zero_denominator())


class NUMPY_IEEE(NUMPY):
    """:class:`NUMPY` whose division by zero gives IEEE's +-inf / NaN (torch's result), for a
    caller that has caught :class:`NUMPY`'s ``ZeroDivisionError`` and reruns under
    ``np.errstate`` (which costs more than the arithmetic, so only then)."""
    div = staticmethod(lambda a, b: a / b)


def _zero_denominator():
    raise ZeroDivisionError("a zero scalar denominator (rerun with NUMPY_IEEE)")
