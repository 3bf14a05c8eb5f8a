"""Exact transformations of a general LP before the Newton forward, undone after it.

Neither is part of the paper's method (whose LPs are well scaled and have no redundant rows);
both exist so that a general LP -- a classic test LP read from MPS, a user's LP -- converges
under the default options, and both map the solution, the multipliers and the active-set
backward back exactly (:func:`solver.output.assemble`):

* :mod:`.presolve` -- empty rows and columns, singleton equality rows (fixed variables);
* :mod:`.scaling` -- Ruiz row and column equilibration (Ruiz 2001).
"""
