r"""Fig. 3c of Meng et al. 2021 (§4.1 eq. 6-7, "sufficient dimension reduction"):
objective and gradient error of the sketched Newton solver against the reduced size ``k``.

The sketch is the solver's own (:mod:`solver.sketch`, ``solve_lp(..., sketch=kind,
sketch_size=k)``): each Newton step replaces :math:`A^\top W_A A` in the Hessian by
:math:`(S W_A^{1/2} A)^\top (S W_A^{1/2} A)` with a fresh :math:`S \in \mathbb R^{k \times m}`
(``gaussian``: i.i.d. :math:`N(0, 1/k)`; ``sampling``: ``k`` violated rows drawn uniformly).
The gradient and the KKT test stay exact, so a solve run to convergence returns the exact vertex
whatever ``k`` (the sketch changes the path); the paper's accuracy/size trade-off appears when
the Newton budget is fixed. Both are measured:

* ``converged``: ``max_iter=300`` Newton steps per eps stage (Newton steps reported);
* ``budget T``: ``max_iter=T`` per eps stage, ``on_fail="warn"``: the vertex recovered from where
  the budget ran out.

Instances: random dense LPs with many more constraints than variables (the regime the paper
sketches): :math:`\min c^\top z` s.t. :math:`Gz \le Gz_0 + u,\ z \le 3,\ z \ge 0`,
:math:`G \in \mathbb R^{m \times n}` standard normal, :math:`z_0, u \sim U(0,1)`,
:math:`c \sim N(0,1)`.  Errors against HiGHS (``scipy.optimize.linprog(method="highs")``):
objective :math:`|v - v^*| / (1 + |v^*|)`; gradient: :math:`\partial v / \partial b` by autograd
through the solver's output against HiGHS's marginals, :math:`\|g - g^*\| / (1 + \|g^*\|)`.
Median and max over ``--seeds`` instances.  CPU, float64.

    OMP_NUM_THREADS=1 python -m scripts.solver.solver_fig_sketch --out results/solver
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from scipy.optimize import linprog

from scripts.solver.bench_solver_report import write_outputs
from lpmetrics.solver import solve_lp
from lpmetrics.solver.errors import LPNotConvergedWarning, LPSolverError

N, M = 50, 2000
SIZES = [25, 50, 100, 200, 400, 800, 1600]


def random_lp(n, m, seed):
    """``(c, A, b)`` numpy float64: ``m`` random rows plus the box ``z <= 3``."""
    g = np.random.default_rng(seed)
    G = g.standard_normal((m, n))
    b = G @ g.uniform(0, 1, n) + g.uniform(0, 1, m)
    return g.standard_normal(n), np.vstack([G, np.eye(n)]), np.concatenate([b, np.full(n, 3.0)])


def highs_oracle(c, A, b):
    """HiGHS's objective and ``d value / d b`` (its inequality marginals)."""
    res = linprog(c, A_ub=A, b_ub=b, bounds=(0, None), method="highs")
    assert res.status == 0, res.message
    return res.fun, res.ineqlin.marginals


def sketched_errors(c, A, b, ref, **options):
    """(objective error, gradient error, Newton steps, seconds) of one solve with ``options``."""
    bt = torch.tensor(b, requires_grad=True)
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LPNotConvergedWarning)
        try:
            sol = solve_lp(torch.tensor(c), torch.tensor(A), bt, **options)
        except LPSolverError:
            return float("nan"), float("nan"), -1, time.perf_counter() - t0
    (g,) = torch.autograd.grad(sol.value, bt)
    seconds = time.perf_counter() - t0
    v = float(sol.value.detach())
    obj_err = abs(v - ref[0]) / (1 + abs(ref[0]))
    grad_err = float(np.linalg.norm(g.numpy() - ref[1]) / (1 + np.linalg.norm(ref[1])))
    return obj_err, grad_err, int(sol.stats["iterations"]), seconds


def run(sizes, kinds, budgets, seeds, n=N, m=M, log=print):
    rows = []
    for seed in range(seeds):
        c, A, b = random_lp(n, m, seed)
        ref = highs_oracle(c, A, b)
        for budget in budgets:
            opts = {"max_iter": budget, "on_fail": "warn"}
            for kind in ["none"] + kinds:
                for k in [None] if kind == "none" else sizes:
                    sk = {} if kind == "none" else {"sketch": kind, "sketch_size": k,
                                                    "sketch_seed": seed}
                    e = sketched_errors(c, A, b, ref, **opts, **sk)
                    rows.append({"seed": seed, "budget": budget, "kind": kind, "k": k,
                                 "obj_err": e[0], "grad_err": e[1], "newton": e[2], "s": e[3]})
        log(f"seed {seed} done")
    return rows


def summary(rows):
    """``{(budget, kind, k): (median obj err, max obj err, median grad err, max grad err,
    median Newton steps, median ms)}``."""
    out = {}
    for key in sorted({(r["budget"], r["kind"], r["k"] or 0) for r in rows}):
        rs = [r for r in rows if (r["budget"], r["kind"], r["k"] or 0) == key]
        col = lambda f: np.array([r[f] for r in rs], dtype=float)      # noqa: E731
        out[key] = (np.median(col("obj_err")), np.max(col("obj_err")), np.median(col("grad_err")),
                    np.max(col("grad_err")), np.median(col("newton")), 1e3 * np.median(col("s")))
    return out


def table(S, m):
    L = ["| Newton budget per eps stage | sketch | k (rows of S; m = " + f"{m}) | objective error "
         "median / max | gradient error median / max | Newton steps | ms |",
         "|---|---|---:|---:|---:|---:|---:|"]
    for (budget, kind, k), v in S.items():
        L.append(f"| {budget} | {kind} | {k or '-'} | {v[0]:.1e} / {v[1]:.1e} | "
                 f"{v[2]:.1e} / {v[3]:.1e} | {v[4]:.0f} | {v[5]:.1f} |")
    return "\n".join(L)


def plot(S, path, budgets, kinds):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, (i, what) in zip(axes, ((0, "objective"), (2, "gradient d value / d b"))):
        for bi, budget in enumerate(budgets):
            for ki, kind in enumerate(kinds):
                pts = sorted((k, max(v[i], 1e-16)) for (bu, kd, k), v in S.items()
                             if bu == budget and kd == kind)
                if pts:
                    ax.plot(*zip(*pts), marker="os"[ki], ls=["-", "--", ":"][bi % 3],
                            color=f"C{bi * len(kinds) + ki}", label=f"{kind}, budget {budget}")
            ref = S.get((budget, "none", 0))
            if ref:
                ax.axhline(max(ref[i], 1e-16), color="k", lw=0.6, ls=["-", "--", ":"][bi % 3])
        ks = sorted({k for (_, kd, k) in S if kd != "none"})
        ax.set(xscale="log", yscale="log", xlabel="reduced size k (rows of the sketch)",
               ylabel="median relative error vs HiGHS", title=what)
        ax.set_xticks(ks, [str(k) for k in ks], minor=False)
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        ax.grid(True, alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle("sketched Newton (black: no sketch at the same budget)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="results/solver")
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)))
    ap.add_argument("--kinds", default="gaussian,sampling")
    ap.add_argument("--budgets", default="300,3", help="max_iter per eps stage")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--n", type=int, default=N)
    ap.add_argument("--m", type=int, default=M)
    ap.add_argument("--report-from", metavar="JSON", help="redraw .md/.png from a saved .json")
    args = ap.parse_args()
    torch.set_num_threads(1)
    budgets = [int(x) for x in args.budgets.split(",")]
    kinds = args.kinds.split(",")
    if args.report_from:
        rows = json.loads(Path(args.report_from).read_text())
    else:
        rows = run([int(k) for k in args.sizes.split(",")], kinds, budgets, args.seeds, args.n,
                   args.m, log=lambda s: print(s, file=sys.stderr, flush=True))
    S = summary(rows)
    write_outputs(args.out, "fig3c_sketch", rows, table(S, args.m),
                  lambda path: plot(S, path, budgets, kinds))


if __name__ == "__main__":
    main()
