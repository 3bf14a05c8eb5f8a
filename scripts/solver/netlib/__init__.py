"""Public test LPs for the solver benchmark: the MPS reader (:mod:`.mps`) and seven classic netlib
LPs beside it (README.md: sources and checksums). Read by ``bench_solver --family public`` and the
solver tests; the LP layer itself never reads files."""
