"""Side-by-side timing of the sparse Newton system on two of its LPs.

* ``auc``: the binary-AUC LP at 1,024 pairs, ``min 1^T z s.t. -z <= d - eps, z >= 0`` with
  ``A = -I`` given as a ``torch.sparse`` CSR tensor (not the ``DiagonalOperator`` ``auc_lp``
  uses: this is the general sparse path);
* ``sparse``: a random sparse LP, ``n = 500``, ``m = 1,001`` (501 random rows of density 5e-3
  plus the box ``z <= 3``), ``c`` normal, feasible by construction (``box_lp`` of the tests).

* ``family500``, ``family2000``, ``family5000``: the random sparse LPs with equality rows of
  ``results/solver/solver_bench.md`` (``bench_solver_measure.random_sparse_lp``).

* ``ones``: the ``sparse`` LP with its last random row replaced by a ones-row (budget
  ``1^T z <= s``; ``m = 1,001``): ``A^T W A`` is dense, so the active-set
  recovery factorises the active rows by a sparse LU (``solver/backends/active_lu.py`` for Newton;
  ``solver/backends/square_active.py`` for HiGHS's vertex).

Each row times fwd+bwd (``(z * w).sum().backward()``; the forward alone with
``--forward-only``) of ``solve_lp`` under one ``linear_solver`` setting, the median of
``--repeats`` calls, and HiGHS's forward alone
(``scipy.optimize.linprog(method="highs")``), in float64 on one CPU thread; the ratio
``/HiGHS`` divides by HiGHS timed alternately with that row (same load).  Run:

    OMP_NUM_THREADS=1 python -m scripts.solver.time_sparse_lp [--repeats 3] [--solvers cholesky,auto]
        [--eps-warmup 0,1,10]   # Newton steps and time with and without the eps warm-up
    OMP_NUM_THREADS=1 python -m scripts.solver.time_sparse_lp --cases ones,sparse --solvers "" \
        --highs-forward --without-lu --repeats 41   # forward='highs' + backward vs HiGHS
        [--highs-core]   # also vs HiGHS through scipy's bindings, without linprog's wrapper
        [--general-route]  # and forward='highs' without solver.backends.host_highs, vs the same core
        [--forward-only]  # every row times the forward alone (no backward)
        [--fresh-inputs]  # c and A built as tensors inside each timed call (the old protocol)
"""
from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import time
import warnings

import numpy as np
import scipy.sparse as sp
import torch
from scipy.optimize import linprog

from lpmetrics.solver import solve_lp


def _backend(name: str):
    """A forward backend's module, from ``solver/backends/`` or, in a checkout older than that
    folder, from ``solver/`` (this script also times older checkouts, copied there); None where
    the checkout has no such module (``host_highs`` before 2026-11-27)."""
    for package in ("lpmetrics.solver.backends", "lpmetrics.solver"):
        try:
            return importlib.import_module(f"{package}.{name}")
        except ModuleNotFoundError:
            continue
    return None


active_lu, highs, square_active, host_highs = map(
    _backend, ("active_lu", "highs", "square_active", "host_highs"))

LU_MIN_N = active_lu.ACTIVE_LU_MIN_N
HOST_ELIGIBLE = square_active.eligible

warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")


def auc_lp(pairs=1024, eps=0.01, seed=0):
    g = np.random.default_rng(seed)
    d = g.standard_normal(pairs) * 0.05           # score differences s_pos - s_neg
    A = -sp.identity(pairs, format="csr")
    return np.ones(pairs), A, d - eps


def random_sparse_lp(n=500, m0=501, density=5e-3, seed=0, ones_row=False):
    """``ones_row``: the last of the ``m0`` random rows is replaced by the budget row
    ``1^T z <= 1^T z0 + slack`` (it makes ``A^T W A`` dense)."""
    g = np.random.default_rng(seed)
    A0 = sp.random(m0 - ones_row, n, density=density, random_state=g,
                   data_rvs=g.standard_normal, format="csr")
    if ones_row:
        A0 = sp.vstack([A0, sp.csr_matrix(np.ones((1, n)))], format="csr")
    z0 = g.uniform(0, 1, n)
    b0 = A0 @ z0 + g.uniform(0, 1, m0)
    A = sp.vstack([A0, sp.identity(n)], format="csr")
    return g.standard_normal(n), A, np.concatenate([b0, np.full(n, 3.0)])


def bench_family(n):
    """``scripts/bench_solver_measure.random_sparse_lp(n)``: the random sparse LPs with
    equality rows of ``results/solver/solver_bench.md``."""
    from scripts.solver.bench_solver_measure import random_sparse_lp as family
    return family(n)


def torch_csr(A):
    A = A.tocsr()
    return torch.sparse_csr_tensor(torch.tensor(A.indptr), torch.tensor(A.indices),
                                   torch.tensor(A.data, dtype=torch.float64), A.shape)


def timed(fn, repeats):
    out, times = None, []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def timed_pair(base, fn, repeats):
    """Medians of ``base`` and ``fn`` called alternately (same load for both: the ratio of a
    side-by-side pair is what the issue's targets are about)."""
    tb, tf, out = [], [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        base()
        t1 = time.perf_counter()
        out = fn()
        tb.append(t1 - t0)
        tf.append(time.perf_counter() - t1)
    return statistics.median(tb), statistics.median(tf), out


def ours(c, A, b, w, backward=True, fresh=False, E=None, b_eq=None, **kw):
    """One fwd(+bwd) call; ``c``, ``A`` (and ``E``, ``b_eq``) are built once as tensors (a
    training loop's LP matrix is), ``b`` per call (the data that require grad); ``fresh``:
    ``c`` and ``A`` per call too (the protocol before 2026-11-27 10:00 UTC, which timed
    ~0.15 ms of tensor building)."""
    ct, At = torch.tensor(c), torch_csr(A)
    eq = (None, None) if E is None else (torch_csr(E), torch.tensor(b_eq))

    def run():
        bt = torch.tensor(b, requires_grad=True)
        sol = solve_lp(*((torch.tensor(c), torch_csr(A)) if fresh else (ct, At)), bt, *eq,
                       **kw)
        if backward:
            (sol.z * w).sum().backward()
        return sol
    return run


def cvxpylayers_auc(c, b, w):
    """The paper's CVXPY-SCS layer on the same LP (``baselines/cvxpy_lp.py``; A = -I)."""
    from lpmetrics.baselines.cvxpy_lp import CvxpyLP
    from lpmetrics.objectives.pairwise import neg_identity
    layer = CvxpyLP(solver="SCS", n_jobs=1)

    def run():
        bt = torch.tensor(b, requires_grad=True)
        z = layer(torch.tensor(c), neg_identity(len(c), bt), bt)
        (z * w).sum().backward()
        return float(z.detach().sum())
    return run


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--solvers", default="cholesky,auto",
                    help="linear_solver settings to time (cholesky: what auto picked before "
                         "the sparse factorisation; auto: what it picks now)")
    ap.add_argument("--cases", default="auc,sparse",
                    help="auc, sparse, ones (the sparse LP with a ones-row)")
    ap.add_argument("--eps-warmup", default="",
                    help="comma list of eps_warmup values, each timed with linear_solver=auto "
                         "(0: no warm-up)")
    ap.add_argument("--highs-forward", action="store_true",
                    help="also time forward='highs' (fwd+bwd)")
    ap.add_argument("--without-lu", action="store_true",
                    help="also time forward='highs' with the sparse active-set LU switched off "
                         "(the normal-equations recovery it replaced)")
    ap.add_argument("--highs-core", action="store_true",
                    help="with --highs-forward: also divide by HiGHS called through scipy's "
                         "bindings without linprog's wrapper (solver.backends.highs._highs_direct, what "
                         "forward='highs' calls), timed alternately")
    ap.add_argument("--general-route", action="store_true",
                    help="with --highs-forward --highs-core: also time forward='highs' through "
                         "the general route (solver.backends.host_highs switched off), against the core")
    ap.add_argument("--fresh-inputs", action="store_true",
                    help="build c and A as tensors inside every timed call too (the protocol "
                         "before 2026-11-27 10:00 UTC; by default they are built once)")
    ap.add_argument("--forward-only", action="store_true",
                    help="time solve_lp's forward alone (the default times fwd+bwd)")
    ap.add_argument("--cvxpylayers", action="store_true",
                    help="also time cvxpylayers (SCS) fwd+bwd on the AUC LP")
    args = ap.parse_args()
    torch.set_num_threads(1)
    cases = {"auc": auc_lp, "sparse": random_sparse_lp,
             "ones": lambda: random_sparse_lp(ones_row=True)}
    for size in (500, 2000, 5000):     # results/solver's random sparse family (with equalities)
        cases[f"family{size}"] = lambda size=size: bench_family(size)
    print(f"{'case':8} {'variant':24} {'ms':>9} {'/HiGHS':>8} {'Newton':>7} {'solver':>9}  "
          f"objective error")
    for name in args.cases.split(","):
        c, A, b, *eq = cases[name]()
        E, be = eq if eq else (None, None)

        def lp():
            return linprog(c, A_ub=A, b_ub=b, A_eq=E, b_eq=be, bounds=(0, None), method="highs")
        th, res = timed(lp, args.repeats)
        print(f"{name:8} {'HiGHS forward':24} {1e3 * th:9.1f} {1.0:8.2f}")
        w = torch.tensor(np.random.default_rng(1).standard_normal(len(c)))
        # forward="newton" explicitly: the default "auto" hands large general LPs to HiGHS
        variants = [(f"newton {s}", dict(forward="newton", linear_solver=s))
                    for s in args.solvers.split(",") if s]
        variants += [(f"newton eps_warmup={w}", dict(forward="newton", eps_warmup=float(w)))
                     for w in args.eps_warmup.split(",") if w]
        if args.highs_forward:
            variants.append(("forward=highs", dict(forward="highs")))
        if args.highs_forward and args.highs_core:
            variants.append(("forward=highs / core", dict(forward="highs")))
        if args.highs_forward and args.highs_core and args.general_route:
            variants.append(("general route / core", dict(forward="highs")))
        if args.without_lu:
            variants.append(("forward=highs, no LU", dict(forward="highs")))
        for label, kw in variants:
            # "no LU": the recovery's least-squares path (normal equations)
            # (neither the host LU of solver.backends.square_active nor the torch path's sparse LU)
            no_lu = label.endswith("no LU")
            active_lu.ACTIVE_LU_MIN_N = 10 ** 9 if no_lu else LU_MIN_N
            square_active.eligible = (lambda prob: None) if no_lu else HOST_ELIGIBLE
            # "general route": the torch glue around HiGHS (solver.backends.host_highs off), as before
            if host_highs is not None:
                host_highs.ENABLED = not (no_lu or label.startswith("general route"))
            # HiGHS alone is timed again, interleaved with this variant: ratio under one load
            base = (lambda: highs._highs_direct(c, A, b, E, be, None)) \
                if label.endswith("/ core") else lp
            th_pair, t, sol = timed_pair(base, ours(c, A, b, w, not args.forward_only,
                                                    args.fresh_inputs, E=E, b_eq=be, **kw),
                                         args.repeats)
            err = abs(float(sol.value.detach()) - res.fun) / (1 + abs(res.fun))
            print(f"{name:8} {label:24} {1e3 * t:9.1f} {t / th_pair:8.2f} "
                  f"{sol.stats['iterations']:7d} {sol.stats['linear_solver']:>9}  {err:.1e}  "
                  f"(HiGHS alongside {1e3 * th_pair:.1f} ms; K_T: "
                  f"{sol.stats.get('active_factor', '-')})")
        if args.cvxpylayers and name == "auc":
            t, value = timed(cvxpylayers_auc(c, b, w), args.repeats)
            err = abs(value - res.fun) / (1 + abs(res.fun))
            print(f"{name:8} {'cvxpylayers (SCS)':24} {1e3 * t:9.1f} {t / th:8.2f} "
                  f"{'':7} {'':>9}  {err:.1e}")


if __name__ == "__main__":
    main()
