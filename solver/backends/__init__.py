"""Forward backends: other ways to reach the vertex that the active-set backward differentiates.

The paper's forward is Newton on the exterior penalty (:mod:`solver.newton`,
:mod:`solver.eps_loop`); these modules exist for engineering reasons, each stated in its
docstring (measurements in ``results/solver/README.md``):

* :mod:`.auto` -- ``forward="auto"``: which forward serves a call, and the time-limit error;
* :mod:`.highs` -- ``forward="highs"``: scipy's HiGHS solves a general CPU LP, our recovery
  certifies its vertex and the active-set backward differentiates it;
* :mod:`.host_highs`, :mod:`.host_guess` -- one small CPU LP (HiGHS's, or a caller's
  ``vertex_guess``) certified end to end on host arrays, without the batched torch route's
  dispatch overhead;
* :mod:`.square_active`, :mod:`.active_lu` -- the square active system of a nondegenerate
  vertex factorised by one LU (LAPACK or SuperLU) instead of the normal equations;
* :mod:`.sparse_factor`, :mod:`.scipy_ops` -- the Newton system as a sparse matrix (SuperLU)
  and the host copies of ``A`` it and HiGHS read.

Each gives the same ``run`` dict or :class:`solver.LPSolution` as the Newton route (tested
against it), so the backward and the statistics are the same whatever served the forward.
"""
