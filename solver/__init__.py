"""Differentiable LP layer: Mangasarian's generalized Newton method on the exterior penalty.

``solve_lp(c, A, b, A_eq=None, b_eq=None, *, backward="active_set", **options)`` solves
``min c^T z s.t. A z <= b, A_eq z = b_eq, z >= 0`` (batched) and returns an
:class:`LPSolution` whose ``z`` is differentiable w.r.t. ``c, A, b, A_eq, b_eq``;
:class:`LPLayer` is the ``nn.Module`` form.  References: Mangasarian 2004, "A Newton method
for linear programming", JOTA 121; Mangasarian 2006, "Exact 1-norm support vector machines
via unconstrained convex differentiable minimization", JMLR 7; Meng et al. 2021, "Differentiable
optimization of generalized nondecomposable functions using linear programs", NeurIPS.

Reading order, the paper's method first: :mod:`.problem` (the LP and its exterior penalty),
:mod:`.newton` (the generalized Newton step) and :mod:`.linsolve` (its linear system),
:mod:`.eps_loop` (the eps rule), :mod:`.recover` (multipliers, active set, vertex),
:mod:`.implicit` (the active-set and unrolled backwards), :mod:`.sketch` (the sketched Newton
direction), :mod:`.solve` (``solve_lp``).  Apart: the forward backends (:mod:`.backends`:
HiGHS, host shortcuts, LU factorisations), the capture-safe forms (:mod:`.capture`) and the
preprocessing of general LPs (:mod:`.preprocess`).  ``docs/solver.md`` maps every file to the
paper's section or to the engineering reason it exists.
"""
if not __name__.startswith("lpmetrics."):   # one identity per class (lpmetrics/__init__.py)
    raise ImportError(f"import lpmetrics.{__name__}, not the bare folder name {__name__!r}")
from lpmetrics.solver.errors import (LPInputError, LPNotConvergedWarning, LPSolverError,
                           LPTimeLimitError, MPSFormatError)
from lpmetrics.solver.layer import LPLayer
from lpmetrics.solver.operators import (DenseOperator, DiagonalOperator, LinearOperator, SparseOperator,
                              as_operator)
from lpmetrics.solver.options import SolverOptions
from lpmetrics.solver.solution import LPSolution
from lpmetrics.solver.solve import solve_lp
from lpmetrics.solver.stacked import HStackOperator, VStackOperator

__all__ = ["solve_lp", "LPLayer", "LPSolution", "LPSolverError", "LPInputError",
           "LPNotConvergedWarning", "LPTimeLimitError", "MPSFormatError", "SolverOptions", "LinearOperator", "DenseOperator",
           "DiagonalOperator", "SparseOperator", "VStackOperator", "HStackOperator",
           "as_operator"]
