r"""Solver benchmark (Meng et al. 2021, fig. 3; §4-5): our LP layer against cvxpylayers,
HiGHS, the paper's dense recipe and the closed form, all methods in one run.

(a) binary-AUC LP (Meng et al. 2021, eq. 1, built by :func:`objectives.pairwise.ramp_lp`,
    ``A = -I`` as a ``DiagonalOperator``): :math:`\min 1^\top z` s.t.
    :math:`-z \le d - \epsilon,\ z \ge 0`, :math:`d_{ij} = s_i - s_j` over (positive, negative)
    pairs, batch 32 ... 4096, balanced and 91 % positives; time = forward + backward of
    ``sum(z * w)`` (random ``w``) w.r.t. the scores.  The same LP through the general paths:
    ``A = -I`` as a ``torch.sparse`` CSR tensor (``ours_csr``) and dense (``ours_dense``),
    ``solver.solve_lp`` with default options.
(b) F1 LP (Meng et al., ICLR 2021 version, §2.4, built by :class:`objectives.ratio.F1LPLoss`):
    ``F1LPLoss()(logits, labels).backward()`` at n = 32 ... 1024, against HiGHS (forward) and
    cvxpylayers (fwd+bwd).
(c) random sparse LPs with equalities (``bench_solver_measure.random_sparse_lp``),
    n = 500 ... 20,000, float64: ``solve_lp`` (Newton forward; ``forward="highs"``) fwd+bwd of
    ``sum(z * w)`` w.r.t. ``b`` against HiGHS's forward.

Every (method, size) cell runs in a fresh subprocess: a warm-up call, one call whose peak memory is
the resident-set high-water mark above the pre-call RSS (``/proc/self/clear_refs`` reset; glibc
told to ``mmap`` blocks > 128 KiB so the warm-up's freed memory has left the process; on CUDA
``torch.cuda.max_memory_allocated``), then the median of several timed calls.  Objective errors
are relative to HiGHS on the same (rounded) data, in float64 and float32.  Writes
``<out>/solver_bench.{md,png,json}``; ``--report-from`` redraws them from a saved ``.json``.

    OMP_NUM_THREADS=1 python -m scripts.solver.bench_solver            # full run (~16 min, shared 2-core VM)
    OMP_NUM_THREADS=1 python -m scripts.solver.bench_solver --quick    # smoke test (~1 min)

``--family public --mps-dir DIR``: every MPS file of ``DIR`` instead (classic public LPs; see
``bench_solver_public.py``), written to ``<out>/public_lps.{md,json}``:

    OMP_NUM_THREADS=1 python -m scripts.solver.bench_solver --family public \
        --mps-dir scripts/solver/netlib --out results/solver
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import torch

# This file: the cells, their order and skip logic, the --worker subprocess per cell and the CLI.
# Measuring one cell: bench_solver_measure.py; the report: bench_solver_report.py (siblings).
from scripts.solver.bench_solver_measure import (AUC_METHODS, F1_METHODS, POSITIVES, ROOT,
                                  SPARSE_METHODS, dense_paper_cost, pairs_of, run_worker)
from scripts.solver.bench_solver_report import machine_info, report_from, write_report

AUC_SIZES = [32, 64, 128, 256, 1024, 4096]
F1_SIZES = [32, 64, 128, 256, 512, 1024]
SPARSE_SIZES = [500, 2000, 5000, 20000]
CAPPED = ("cvxpylayers", "dense_paper", "ours_csr", "ours_dense",  # skipped beyond the size
          "newton", "newton_highs", "highs")                        # where one call > cap
MAX_MEASURE = {"ours_dense": 2_000}  # dense A = -I: M^2 entries and an M x M Newton system
DENSE_MAX_BYTES = 4e9       # the dense recipe is skipped where it cannot fit in ~4 GB
DENSE_MAX_S = 60.0          # ... or would take longer than this
TIMING_BUDGET_S = 3.0       # timed calls per cell: ~this much wall time, 5..MAX_CALLS calls
MAX_CALLS = 30              # (both passed to the worker in the cell's spec)
CELL_TIMEOUT_S = 600
SPARSE_TIMEOUT_S = 240      # a random sparse LP cell (warm-up + timed calls) may take this long


def run_cell(spec, in_process=False):
    """Run one cell in a fresh subprocess (or here); returns its result dict or an error."""
    if in_process:
        return run_worker(spec)
    cmd = [sys.executable, "-m", "scripts.solver.bench_solver", "--worker", json.dumps(spec)]
    timeout = SPARSE_TIMEOUT_S if spec["problem"] == "sparse" else CELL_TIMEOUT_S
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"skipped": f"timed out (> {timeout} s)"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()
        return {"error": (tail[-1] if tail else f"exit code {proc.returncode}")[-300:]}
    return json.loads(lines[-1])


# ---------------------------------------------------------------------------- the run
def skip_reason(spec, last, cap_s):
    """Why a cell is not run (``None``: run it); ``last`` = (size measure, median seconds per
    call) of the previous size of the same (problem, positives, method)."""
    m, method = spec["measure"], spec["method"]
    if m > MAX_MEASURE.get(method, m):
        return f"skipped (> {MAX_MEASURE[method]} pairs)"
    if method == "dense_paper":
        nbytes, _ = dense_paper_cost(m, torch.finfo(getattr(torch, spec["dtype"])).bits // 8)
        if nbytes > DENSE_MAX_BYTES:
            return f"skipped (needs ~{nbytes / 1e9:.3g} GB > 4 GB)"
        if last and last[1] * (m / last[0]) ** 3 > DENSE_MAX_S:
            return f"skipped (est. {last[1] * (m / last[0]) ** 3:.0f} s > {DENSE_MAX_S:.0f} s)"
    if method in CAPPED and last:
        if last[1] > cap_s:
            return f"skipped (> {cap_s:.0f} s)"
        if last[1] * m / last[0] > 2 * cap_s:      # even linear scaling says so
            return f"skipped (est. > {cap_s:.0f} s)"
    return None


def cells(auc_sizes, f1_sizes, sparse_sizes=()):
    for pos in POSITIVES:
        for size in auc_sizes:
            for method in AUC_METHODS + ["accuracy"]:
                yield {"problem": "auc", "positives": pos, "size": size, "method": method,
                       "measure": pairs_of(size, POSITIVES[pos])}
    for size in f1_sizes:
        for method in F1_METHODS + ["accuracy"]:
            yield {"problem": "f1", "positives": "-", "size": size, "method": method,
                   "measure": size}
    for size in sparse_sizes:            # timed in float64, as the baseline numbers
        for method in SPARSE_METHODS + ["accuracy"]:
            yield {"problem": "sparse", "positives": "-", "size": size, "method": method,
                   "measure": size, "dtype": "float64"}


def run_benchmark(auc_sizes, f1_sizes, dtype="float32", device="cpu", cap_s=30.0,
                  in_process=False, log=print, sparse_sizes=()):
    """All cells in order of size; returns ``{(problem, positives, size, method): result}``."""
    results, last, dead = {}, {}, {}
    for spec in cells(auc_sizes, f1_sizes, sparse_sizes):
        seeds = 1 if spec["problem"] == "sparse" or spec["measure"] > 100_000 else 3
        spec = {"dtype": dtype, **spec, "device": device, "cap_s": cap_s, "seeds": seeds,
                "budget_s": TIMING_BUDGET_S, "max_calls": MAX_CALLS}
        key = (spec["problem"], spec["positives"], spec["size"], spec["method"])
        line = key[:3] + (spec["method"],)
        lkey = (spec["problem"], spec["positives"], spec["method"])
        reason = dead.get(lkey) or skip_reason(spec, last.get(lkey), cap_s)
        if reason:
            if "GB" not in reason:           # a time cap carries to larger sizes
                dead[lkey] = reason
            results[key] = {"skipped": reason}
            log(f"{line}: {reason}")
            continue
        t0 = time.perf_counter()
        res = run_cell(spec, in_process)
        results[key] = res
        if "median_ms" in res:
            last[lkey] = (spec["measure"], res["median_ms"] / 1e3)
        elif spec["method"] in CAPPED:
            dead[lkey] = res.get("skipped") or "skipped (failed at a smaller size)"
        log(f"{line}: {res.get('median_ms', res.get('float64', res))} "
            f"[{time.perf_counter() - t0:.1f} s]")
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="sizes 32 and 64 (sparse LPs: 500) only (smoke test)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"],
                    help="dtype of the timed runs (errors are always reported in both)")
    ap.add_argument("--out", default=str(ROOT / "results" / "solver"))
    ap.add_argument("--cap", type=float, default=30.0, help="seconds per call before skipping")
    ap.add_argument("--report-from", metavar="JSON",
                    help="rewrite the .md/.png from a saved run's .json (no measuring)")
    ap.add_argument("--family", choices=["paper", "public"], default="paper",
                    help="paper: the AUC/F1/random sparse cells above; public: MPS files")
    ap.add_argument("--mps-dir", help="--family public: folder of .mps files")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(run_worker(json.loads(args.worker))), flush=True)
        return
    if args.report_from:
        report_from(args.report_from, args.out)
        return
    meta = {**machine_info(), "dtype": args.dtype, "device": args.device, "cap_s": args.cap,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "command": f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '')} python "
                       + " ".join(shlex.quote(a) for a in ["-m", "scripts.solver.bench_solver"] + sys.argv[1:])}
    if args.family == "public":
        if not args.mps_dir:
            ap.error("--family public needs --mps-dir (a folder of .mps files, e.g. "
                     "scripts/solver/netlib)")
        from scripts.solver.bench_solver_public import run_public, write_public_report
        rows = run_public(args.mps_dir, log=lambda s: print(s, file=sys.stderr, flush=True))
        write_public_report(rows, meta, Path(args.out))
        print(f"wrote {Path(args.out) / 'public_lps'}.md/.json", file=sys.stderr)
        return
    sizes = ([32, 64], [32, 64], [500]) if args.quick else (AUC_SIZES, F1_SIZES, SPARSE_SIZES)
    R = run_benchmark(*sizes[:2], dtype=args.dtype, device=args.device, cap_s=args.cap,
                      log=lambda s: print(s, file=sys.stderr, flush=True), sparse_sizes=sizes[2])
    stem = "solver_bench_quick" if args.quick else "solver_bench"
    write_report(R, meta, Path(args.out), stem)
    print(f"wrote {Path(args.out) / stem}.md/.png/.json", file=sys.stderr)


if __name__ == "__main__":
    main()
