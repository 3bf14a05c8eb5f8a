"""Capture-safe forms of the solver: fixed shapes, fixed counts, no host synchronisation.

``solve_lp(..., capture_safe=True)`` runs the paper's algorithm (Mangasarian 2004, JOTA 121;
Meng et al. 2021, sec. 4) with every host decision replaced by a device mask, so a whole
training step can run under ``torch.compile(fullgraph=True)`` or be replayed as a CUDA graph
(the packed launcher's step).  Why it exists: on a GPU each ``bool(tensor)`` of the standard
path is a synchronisation and a launch gap, and a CUDA graph cannot contain one.

* :mod:`.separable` -- separable LPs (``A`` a :class:`solver.DiagonalOperator`, no equality
  rows: the AUC-family LPs): fixed-count Newton and eps stages, device-side flags and stats;
* :mod:`.guess` -- a general dense LP with a ``vertex_guess`` (the ratio losses): the guess
  certified on the device by one batched Cholesky and the KKT check.
"""
