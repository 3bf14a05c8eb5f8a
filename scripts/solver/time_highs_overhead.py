"""Where ``forward="highs"``'s time beyond HiGHS goes, on the LPs of ``scripts/solver/time_sparse_lp.py``
(``results/solver/README.md`` §8).

Two measurements, one process, float64, one CPU thread:

* **cold after HiGHS**: the median time of one 500-element numpy product called right after a
  HiGHS solve and called again at once (``--probes`` solves), and the threads the process has
  (HiGHS's worker threads would show there);
* **the pieces**: fwd+bwd of ``solve_lp(..., forward="highs")`` on a sparse CSR ``A`` (the host
  route, :mod:`solver.backends.host_highs`), each call right after HiGHS alone as ``time_sparse_lp.py
  --highs-core`` times it, with the route's steps timed from outside (their module functions
  wrapped: nothing in ``solver/`` is changed; "of which SuperLU" is the certificate's one sparse
  LU, :func:`solver.backends.active_lu.lu_of_arrays`); "rest of the forward" is what the forward spends
  outside those steps (``solve_lp``'s options and dispatch, the input checks, the host views).
  The ``b`` tensor is made before HiGHS runs and is not timed (``time_sparse_lp.py`` times it
  inside its call: ~0.15 ms).

Run (stop other CPU work first; the numbers swing with the load):

    OMP_NUM_THREADS=1 python -m scripts.solver.time_highs_overhead [--cases family500,sparse] [--repeats 61]
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
import warnings

import numpy as np
import torch

from lpmetrics.solver import solve_lp
from lpmetrics.solver.backends import highs, host_highs, square_active
from scripts.solver.time_sparse_lp import bench_family, random_sparse_lp, torch_csr

warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
warnings.filterwarnings("ignore", message="Sparse invariant checks")
CASES = {"ones": lambda: random_sparse_lp(ones_row=True), "sparse": random_sparse_lp,
         "family500": lambda: bench_family(500), "family2000": lambda: bench_family(2000)}
# the host route's steps, in call order (solver.backends.host_highs.solve)
STEPS = ("_csr", "_method", "solve_host", "certify", "certified_solution")


def ms(values) -> float:
    return 1e3 * statistics.median(values)


def cold_probe(lp, probes: int) -> tuple[float, float, int]:
    c, A, b, E, be = lp
    x = np.ones(500)
    first, second = [], []
    for _ in range(probes):
        highs._highs_direct(c, A, b, E, be, None)
        for out in (first, second):
            t0 = time.perf_counter()
            x * 2.0
            out.append(time.perf_counter() - t0)
    return 1e3 * ms(first), 1e3 * ms(second), len(os.listdir("/proc/self/task"))


def pieces(lp, repeats: int) -> dict[str, float]:
    c, A, b, E, be = lp
    timed: dict[str, list[float]] = {}
    saved = {name: getattr(host_highs, name) for name in STEPS}
    lu = square_active.lu_of_arrays               # SuperLU inside the certificate

    def wrap(name, fn):
        def call(*args, **kwargs):
            t0 = time.perf_counter()
            out = fn(*args, **kwargs)
            timed.setdefault(name, []).append(time.perf_counter() - t0)
            return out
        return call
    ct, At = torch.tensor(c), torch_csr(A)
    eq = (None, None) if E is None else (torch_csr(E), torch.tensor(be))
    w = torch.tensor(np.random.default_rng(1).standard_normal(len(c)))
    core, fwd, bwd = [], [], []
    try:
        for name, fn in saved.items():
            setattr(host_highs, name, wrap(name, fn))
        square_active.lu_of_arrays = wrap("lu", lu)
        for _ in range(repeats):
            bt = torch.tensor(b, requires_grad=True)      # (the data, made before: not timed)
            t0 = time.perf_counter()
            highs._highs_direct(c, A, b, E, be, None)
            t1 = time.perf_counter()
            sol = solve_lp(ct, At, bt, *eq, forward="highs")
            t2 = time.perf_counter()
            (sol.z * w).sum().backward()
            t3 = time.perf_counter()
            core.append(t1 - t0), fwd.append(t2 - t1), bwd.append(t3 - t2)
    finally:
        for name, fn in saved.items():
            setattr(host_highs, name, fn)
        square_active.lu_of_arrays = lu
    if sol.stats.get("active_factor") != "sparse_lu":
        raise SystemExit(f"this LP did not take the host route ({sol.stats.get('active_factor')})")
    out = {"HiGHS alone (core)": ms(core)}
    # a step not called on every call (none here) would count by its median over the calls made
    steps = {name: ms(timed[name]) * len(timed[name]) / repeats for name in STEPS if name in timed}
    for name, v in steps.items():
        out[f"  {name}"] = v
        if name == "certify":
            out["    of which SuperLU"] = ms(timed["lu"])
    out["  rest of the forward"] = ms(fwd) - sum(steps.values())
    out["backward"] = ms(bwd)
    out["fwd+bwd"] = ms(fwd) + ms(bwd)
    out["fwd+bwd - HiGHS inside"] = out["fwd+bwd"] - steps["solve_host"]
    out["fwd+bwd / core"] = out["fwd+bwd"] / out["HiGHS alone (core)"]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", default="family500,sparse")
    ap.add_argument("--repeats", type=int, default=61)
    ap.add_argument("--probes", type=int, default=30)
    args = ap.parse_args()
    torch.set_num_threads(1)
    for name in args.cases.split(","):
        c, A, b, *eq = CASES[name]()
        lp = (c, A, b, *(eq if eq else (None, None)))
        first, second, threads = cold_probe(lp, args.probes)
        print(f"{name}: a 500-element numpy product right after HiGHS {first:.1f} us, "
              f"at once again {second:.1f} us (median of {args.probes}; {threads} thread(s) "
              f"in the process)")
        for label, value in pieces(lp, args.repeats).items():
            unit = "x" if label.endswith("/ core") else " ms"
            print(f"  {label:28} {value:8.3f}{unit}")


if __name__ == "__main__":
    main()
