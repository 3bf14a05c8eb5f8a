"""Solver benchmarks, timings and figures (the LP layer against cvxpylayers, HiGHS and the dense
recipe; the paper's Fig. 3b/3c, appendix A.3/A.4). Imports only the installed core and its siblings."""
