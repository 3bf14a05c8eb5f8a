r"""Fig. 3b of Meng et al. 2021 (§5, "Comparing with blackbox solvers"): forward and
backward time of our LP layer against the blackbox-solver differentiation of Pogančić et al.
(ICLR 2020; :class:`baselines.blackbox.BlackboxLP`: HiGHS forward, one more HiGHS solve at the
perturbed cost :math:`c + \lambda\,\partial L/\partial z` backward), on a batch of AUC LPs.

The instances follow the paper ("we randomly construct LP problems using AUC as an example and
make the cost vector the parameter"): ``batch`` independent LPs, each the AUC LP of a minibatch
of 8 positives and 8 negatives (64 pairs, scores = sigmoid of normals), in the cost form of
:func:`baselines.blackbox.auc_cost_lp`,

.. math::  \min_u (d - \epsilon)^\top u \quad\text{s.t.}\quad u \le 1,\ u \ge 0,

loss :math:`L = \sum w \odot u^*` (random ``w``), gradient w.r.t. the cost. Methods:

* ``ours (cost LP)``: :func:`solver.solve_lp` on that LP, batched, ``A = I`` a
  ``DiagonalOperator``; its active-set gradient w.r.t. ``c`` is exactly zero (the vertex
  :math:`\tilde A^{-1}\tilde b` is locally constant in ``c``, which is why the blackbox method
  exists), so there is no graph and the backward time is ~0;
* ``ours (pairwise LP)``: the same AUC through the primal pairwise LP of ``auc_lp``
  (:math:`\min 1^\top z` s.t. :math:`-z \le d - \epsilon`), margins in ``b``: the informative
  gradient our objective trains with;
* ``blackbox (HiGHS)``: ``BlackboxLP(I, 1, lam=10)``, one ``linprog`` per instance forward and
  one per instance backward.

Time = median wall time over repeated calls (CPU, float64, one thread); a method is skipped at
the sizes where its previous size, scaled linearly, exceeds ``--cap`` seconds per call.

    OMP_NUM_THREADS=1 python -m scripts.solver.solver_fig_blackbox --out results/solver
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from scripts.solver.bench_solver_report import write_outputs
from lpmetrics.baselines.blackbox import BlackboxLP
from lpmetrics.solver import DiagonalOperator, solve_lp

EPS = 0.01
N_POS = N_NEG = 8                 # 64 pairs per LP
BATCHES = [32, 64, 128, 256, 512, 1024, 2048, 4096]
METHODS = ["ours (cost LP)", "ours (pairwise LP)", "blackbox (HiGHS)"]


def instance(batch, seed=0):
    """Margins ``d [batch, 64]`` of random minibatches and loss weights ``w`` of the same shape."""
    g = torch.Generator().manual_seed(seed)
    s = torch.sigmoid(torch.randn(batch, N_POS + N_NEG, generator=g, dtype=torch.float64))
    d = (s[:, :N_POS, None] - s[:, None, N_POS:]).reshape(batch, -1)
    return d, torch.rand(d.shape, generator=g, dtype=torch.float64)


def layer(method, m):
    """``f(param) -> u*`` for one method; ``param`` is the cost ``d - eps`` (cost forms) or
    ``d - eps`` as ``b`` (pairwise form, where ``z* = relu(eps - d) = -(d - eps) * u*``)."""
    ones = torch.ones(m, dtype=torch.float64)
    if method == "blackbox (HiGHS)":
        bb = BlackboxLP(DiagonalOperator(ones), ones, lam=10.0)
        return bb
    if method == "ours (cost LP)":
        return lambda c: solve_lp(c, DiagonalOperator(ones), ones.expand_as(c)).z
    return lambda b: solve_lp(torch.ones_like(b), DiagonalOperator(-ones), b).z


def time_method(method, batch, repeats, seed=0):
    """(forward s, backward s, objective sum) medians over ``repeats`` calls."""
    d, w = instance(batch, seed)
    f = layer(method, d.shape[1])
    fwd, bwd = [], []
    for _ in range(repeats):
        p = (d - EPS).clone().requires_grad_()
        t0 = time.perf_counter()
        u = f(p)
        t1 = time.perf_counter()
        if u.requires_grad:        # ours (cost LP): z* = A~^-1 b~ has no path to c, no graph
            (u * w).sum().backward()
        t2 = time.perf_counter()
        fwd.append(t1 - t0)
        bwd.append(t2 - t1)
    z = u.detach() if method == "ours (pairwise LP)" else -(d - EPS) * u.detach()
    return statistics.median(fwd), statistics.median(bwd), float(z.sum())


def run(batches, cap_s, log=print):
    rows, last = [], {}
    for batch in batches:
        for method in METHODS:
            prev = last.get(method)
            if prev and prev[1] * batch / prev[0] > cap_s:
                rows.append({"batch": batch, "method": method, "skipped": f"est. > {cap_s:g} s"})
                log(f"{batch} {method}: skipped")
                continue
            time_method(method, min(batch, 32), 1)               # warm-up (lazy imports)
            est = prev[1] * batch / prev[0] if prev else 0.0
            repeats = 1 if est > 5 else 3 if est > 0.5 else 7
            fwd, bwd, value = time_method(method, batch, repeats)
            last[method] = (batch, fwd + bwd)
            rows.append({"batch": batch, "method": method, "fwd_ms": 1e3 * fwd,
                         "bwd_ms": 1e3 * bwd, "calls": repeats, "value": value})
            log(f"{batch} {method}: fwd {1e3 * fwd:.1f} ms, bwd {1e3 * bwd:.1f} ms")
    return rows


def table(rows):
    by = {(r["batch"], r["method"]): r for r in rows}
    cell = lambda r, k: r.get("skipped", "-") if k not in r else f"{r[k]:.1f}"  # noqa: E731
    L = ["| batch (LPs of 64 pairs) | " + " | ".join(f"{m} fwd ms | {m} bwd ms" for m in METHODS)
         + " | blackbox / ours fwd+bwd (cost LP; pairwise LP) | max objective diff |",
         "|---:|" + "---:|" * (2 * len(METHODS) + 2)]
    tot = lambda r: r["fwd_ms"] + r["bwd_ms"]                         # noqa: E731
    for b in sorted({r["batch"] for r in rows}):
        rs = [by.get((b, m), {}) for m in METHODS]
        ratio, diff = "-", "-"
        if all("fwd_ms" in r for r in rs):
            ratio = f"{tot(rs[2]) / tot(rs[0]):.0f}x; {tot(rs[2]) / tot(rs[1]):.0f}x"
        vals = [r["value"] for r in rs if "value" in r]
        if len(vals) > 1:
            diff = f"{(max(vals) - min(vals)) / max(abs(max(vals)), 1e-12):.1e}"
        L.append(f"| {b} | " + " | ".join(f"{cell(r, 'fwd_ms')} | {cell(r, 'bwd_ms')}" for r in rs)
                 + f" | {ratio} | {diff} |")
    return "\n".join(L)


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, key, title in zip(axes, ("fwd_ms", "bwd_ms"), ("forward", "backward")):
        for i, m in enumerate(METHODS):
            pts = sorted((r["batch"], r[key]) for r in rows if r["method"] == m and key in r)
            if pts:
                ax.plot(*zip(*pts), marker="os^"[i], label=m)
        ax.set(xscale="log", yscale="log", xlabel="batch size (LPs of 64 pairs)",
               ylabel="median time, ms", title=f"{title} (CPU, float64, 1 thread)")
        ax.set_xscale("log", base=2)
        ax.grid(True, alpha=0.3)
    axes[0].legend(fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="results/solver")
    ap.add_argument("--batches", default=",".join(map(str, BATCHES)))
    ap.add_argument("--cap", type=float, default=60.0, help="seconds per call before skipping")
    ap.add_argument("--report-from", metavar="JSON", help="redraw .md/.png from a saved .json")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.report_from:
        rows = json.loads(Path(args.report_from).read_text())
    else:
        rows = run([int(b) for b in args.batches.split(",")], args.cap,
                   log=lambda s: print(s, file=sys.stderr, flush=True))
    write_outputs(args.out, "fig3b_blackbox", rows, table(rows), lambda path: plot(rows, path))


if __name__ == "__main__":
    main()
