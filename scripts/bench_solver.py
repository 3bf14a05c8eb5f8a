r"""Solver benchmark (Meng et al. 2021, fig. 3; seed 002 §4-5): our LP layer against cvxpylayers,
HiGHS, the paper's dense recipe and the closed form, all methods in one run.

(a) binary-AUC LP (seed 002 eq. 1, built by :func:`objectives.pairwise.ramp_lp`, ``A = -I`` as a
    ``DiagonalOperator``): :math:`\min 1^\top z` s.t. :math:`-z \le d - \epsilon,\ z \ge 0`,
    :math:`d_{ij} = s_i - s_j` over (positive, negative) pairs, batch 32 ... 4096, balanced and
    91 % positives; time = forward + backward of ``sum(z * w)`` (random ``w``) w.r.t. the scores.
(b) F1 LP (seed 001 §2.4, built by :class:`objectives.ratio.F1LPLoss`): ``F1LPLoss()(logits,
    labels).backward()`` at n = 32 ... 1024, against HiGHS (forward) and cvxpylayers (fwd+bwd).

Every (method, size) cell runs in a fresh subprocess: a warm-up call, one call whose peak memory is
the resident-set high-water mark above the pre-call RSS (``/proc/self/clear_refs`` reset; glibc
told to ``mmap`` blocks > 128 KiB so the warm-up's freed memory has left the process; on CUDA
``torch.cuda.max_memory_allocated``), then the median of several timed calls.  Objective errors
are relative to HiGHS on the same (rounded) data, in float64 and float32.  Writes
``<out>/solver_bench.{md,png,json}``; ``--report-from`` redraws them from a saved ``.json``.

    OMP_NUM_THREADS=1 python scripts/bench_solver.py            # full run (~16 min, shared 2-core VM)
    OMP_NUM_THREADS=1 python scripts/bench_solver.py --quick    # smoke test (~1 min)
"""
from __future__ import annotations

import argparse
import ctypes
import gc
import json
import math
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

EPS = 0.01                  # ramp width: the paper's epsilon (seed 002 §5)
AUC_SIZES = [32, 64, 128, 256, 1024, 4096]
F1_SIZES = [32, 64, 128, 256, 512, 1024]
POSITIVES = {"balanced": 0.5, "91%": 0.91}
AUC_METHODS = ["ours", "cvxpylayers", "highs", "dense_paper", "closed_form"]
F1_METHODS = ["ours", "cvxpylayers", "highs"]
LABELS = {"ours": "ours (Newton, structured A)", "cvxpylayers": "cvxpylayers (SCS)",
          "highs": "HiGHS (forward only)", "dense_paper": "dense paper recipe",
          "closed_form": "closed form max(0, eps-d)"}
CAPPED = ("cvxpylayers", "dense_paper")   # skipped beyond the size where one call > cap
DENSE_MAX_BYTES = 4e9       # the dense recipe is skipped where it cannot fit in ~4 GB
DENSE_MAX_S = 60.0          # ... or would take longer than this
TIMING_BUDGET_S = 3.0       # timed calls per cell: ~this much wall time, 5..MAX_CALLS calls
MAX_CALLS = 30
CELL_TIMEOUT_S = 600


# ---------------------------------------------------------------------------------- instances
def auc_instance(batch, positives, dtype, device, seed=0):
    """Scores ``[batch]`` (sigmoid of normals, as softmax outputs), labels, weights ``[pairs]``."""
    g = torch.Generator().manual_seed(seed)
    n_pos = min(batch - 1, max(1, round(positives * batch)))
    labels = (torch.arange(batch) < n_pos).long().to(device)
    scores = torch.sigmoid(torch.randn(batch, generator=g, dtype=torch.float64))
    w = torch.rand(n_pos * (batch - n_pos), generator=g, dtype=torch.float64)
    return (scores.to(dtype=dtype, device=device).requires_grad_(), labels,
            w.to(dtype=dtype, device=device))


def f1_instance(n, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, 2, generator=g, dtype=torch.float64)
    labels = (torch.rand(n, generator=g) < 0.5).long()
    labels[0] = 1                                        # at least one positive
    return logits.to(dtype=dtype, device=device).requires_grad_(), labels.to(device)


def pairs_of(batch, positives):
    n_pos = min(batch - 1, max(1, round(positives * batch)))
    return n_pos * (batch - n_pos)


# ---------------------------------------------------------------------------- dense recipe
def dense_paper_auc(d, eps):
    """The authors' recipe on a materialised ``A = [-I; -I]`` (``2M x M``), ``b = [d - eps; 0]``:
    ridge (1e-3) least-squares start, 20 full Newton steps on the penalty
    ``1/2 |(Az - b)_+|^2 + 1e-3 c^T z`` with ``(A^T D A + 1e-4 I)^{-1}`` formed by a dense inverse,
    dual by thresholding, primal from the active rows with ridge 0.01; autograd through all of it.
    (``D`` is applied as a row scaling instead of the authors' ``2M x 2M`` ``diag_embed``.)"""
    M = d.numel()
    eye = torch.eye(M, dtype=d.dtype, device=d.device)
    A = torch.cat([-eye, -eye], 0)
    b = torch.cat([d - eps, torch.zeros_like(d)])
    c = torch.ones_like(d)
    x = torch.linalg.solve(A[:M].T @ A[:M] + 1e-3 * eye, A[:M].T @ b[:M])
    for _ in range(20):
        r = A @ x - b
        P = A.T @ ((r > 0).to(d.dtype)[:, None] * A) + 1e-4 * eye
        x = x - torch.inverse(P) @ (A.T @ torch.relu(r) + 1e-3 * c)
    active = (torch.relu(A @ x - b) / eps > 0).detach()
    Aj, bj = A[active], b[active]
    return torch.linalg.solve(Aj.T @ Aj + 0.01 * eye, Aj.T @ bj)


def dense_paper_cost(M, itemsize):
    """(bytes, flops) of :func:`dense_paper_auc` with its autograd graph (20 saved P, P^-1, DA)."""
    return itemsize * M * M * (3 + 20 * 4), 3 * 20 * (4 + 2) * M ** 3


# ------------------------------------------------------------------------------- methods
def highs(c, A_ub, b_ub, A_eq=None, b_eq=None):
    """HiGHS (dual simplex / presolve) through scipy; returns ``(x, objective)``."""
    from scipy.optimize import linprog
    res = linprog(c, A_ub=A_ub, b_ub=b_ub, A_eq=A_eq, b_eq=b_eq, bounds=(0, None),
                  method="highs")
    if res.status != 0:
        raise RuntimeError(f"HiGHS failed: {res.message}")
    return res.x, float(res.fun)


def auc_highs_value(d):
    import scipy.sparse as sp
    M = d.numel()
    dd = d.detach().cpu().double().numpy()
    return highs(np.ones(M), -sp.identity(M, format="csr"), dd - EPS)[1]


def make_auc_call(method, batch, positives, dtype, device, seed=0):
    """A callable doing one forward(+backward) and returning the LP objective ``1^T z``."""
    from objectives.auc import auc_pairs
    from objectives.pairwise import neg_identity, ramp_lp
    s, y, w = auc_instance(batch, positives, dtype, device, seed)
    if method == "highs":
        import scipy.sparse as sp
        A = -sp.identity(w.numel(), format="csr")          # prebuilt: favourable to HiGHS

        def call():
            d = auc_pairs(s.detach(), y).cpu().double().numpy()
            return highs(np.ones(d.size), A, d - EPS)[1]
        return call
    if method == "cvxpylayers":
        from baselines.cvxpy_lp import CvxpyLP
        layer = CvxpyLP(solver="SCS", n_jobs=1)

    def call():
        s.grad = None
        d = auc_pairs(s, y)
        if method == "ours":
            z, sol = ramp_lp(d, EPS)
            call.stats = sol.stats
        elif method == "closed_form":
            z, _ = ramp_lp(d, EPS, method="closed_form")
        elif method == "cvxpylayers":
            z = layer(torch.ones_like(d), neg_identity(d.numel(), d), d - EPS)
        else:
            z = dense_paper_auc(d, EPS)
        (z * w).sum().backward()
        return float(z.detach().double().sum())
    return call


def make_f1_call(method, n, dtype, device, seed=0):
    from objectives.ratio import F1LPLoss, phi_of_logits, PHI_MARGIN
    logits, labels = f1_instance(n, dtype, device, seed)
    if method == "highs":
        import scipy.sparse as sp
        phi = phi_of_logits(logits.detach()).clamp(-1 + PHI_MARGIN, 1 - PHI_MARGIN)
        lp = F1LPLoss().build_lp(phi, labels.to(dtype))
        args = [t.detach().cpu().double().numpy() for t in (lp.c, lp.A, lp.b, lp.A_eq, lp.b_eq)]
        args[1], args[3] = sp.csr_matrix(args[1]), sp.csr_matrix(args[3])  # prebuilt

        def call():
            return highs(*args)[1]
        return call
    if method == "cvxpylayers":
        from baselines.cvxpy_lp import F1CvxpyLoss
        loss_fn = F1CvxpyLoss(n_jobs=1)
    else:
        loss_fn = F1LPLoss()

    def call():
        logits.grad = None
        loss = loss_fn(logits, labels)     # = c^T x*, the LP objective (-relaxed F1)
        loss.backward()
        if method == "ours":
            call.stats = loss_fn.pop_stats()   # mean Newton iterations of the solve
        return float(loss.detach().double())
    return call


# -------------------------------------------------------------------------- measurement
def _proc_kb(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1])
    return 0


def _mallopt(mmap_threshold, trim_threshold):
    """glibc: blocks above ``mmap_threshold`` are mmap'ed (and unmapped when freed)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, mmap_threshold)     # M_MMAP_THRESHOLD
        libc.mallopt(-1, trim_threshold)     # M_TRIM_THRESHOLD
        libc.malloc_trim(0)
    except OSError:
        pass


def peak_memory_mb(call, device):
    """Peak memory of one call above what was in use before it (MiB).  On the CPU this must run
    before anything has been freed to glibc's heap under its default (dynamic) mmap threshold:
    a heap chunk reused by the call would not raise the high-water mark."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        call()
        return (torch.cuda.max_memory_allocated() - base) / 2**20
    _mallopt(128 * 1024, 128 * 1024)
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")                     # reset VmHWM to the current RSS
    except OSError:
        return float("nan")
    base = _proc_kb("VmRSS")
    call()
    return (_proc_kb("VmHWM") - base) / 1024


def measure(spec):
    """One cell: warm-up, median time of repeated calls, peak memory, objective value."""
    dtype, device = getattr(torch, spec["dtype"]), torch.device(spec["device"])
    if spec["problem"] == "auc":
        call = make_auc_call(spec["method"], spec["size"], POSITIVES[spec["positives"]],
                             dtype, device)
    else:
        call = make_f1_call(spec["method"], spec["size"], dtype, device)

    def timed():
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        value = call()
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t0, value

    first, value = timed()                   # warm-up (with big blocks mmap'ed, see run_worker)
    out = {"value": value, "first_s": first}
    if first > spec["cap_s"]:          # one call only: the warm-up is the sample
        out.update(times_ms=[1e3 * first], note="1 call incl. warm-up")
        out["peak_mb"] = float("nan")
    else:
        out["peak_mb"] = peak_memory_mb(call, device)
        _mallopt(32 * 2**20, 64 * 2**20)     # ~glibc's own steady state for the timing
        if first < 1.0:                # fast calls: warm up ~1 s (lazy init, caches)
            until = time.perf_counter() + min(1.0, max(0.3, 5 * first))
            while time.perf_counter() < until:
                timed()
        min_n = 1 if first > 10 else 3 if first > 2 else 5
        times = []
        while len(times) < min_n or (len(times) < MAX_CALLS and sum(times) < TIMING_BUDGET_S):
            times.append(timed()[0])
        out["times_ms"] = [1e3 * t for t in times]
    out["median_ms"] = statistics.median(out["times_ms"])
    out["stats"] = {k: v for k, v in getattr(call, "stats", {}).items()
                    if k in ("iterations", "eps_steps", "linear_solver", "lp_iterations")}
    return out


def accuracy(spec):
    """Max relative objective error of our solver vs HiGHS on the same data, f64 and f32."""
    from objectives.auc import auc_pairs
    from objectives.pairwise import ramp_lp
    from objectives.ratio import F1LPLoss, PHI_MARGIN, phi_of_logits
    from objectives.common import solve
    device = torch.device(spec["device"])
    out = {}
    for dname in ("float64", "float32"):
        errs, refs = [], []
        for seed in range(spec["seeds"]):
            dtype = getattr(torch, dname)
            if spec["problem"] == "auc":
                s, y, _ = auc_instance(spec["size"], POSITIVES[spec["positives"]], dtype,
                                       device, seed)
                d = auc_pairs(s, y)
                ours = float(ramp_lp(d, EPS)[0].detach().double().sum())
                ref = auc_highs_value(d)
            else:
                import scipy.sparse as sp
                logits, labels = f1_instance(spec["size"], dtype, device, seed)
                phi = phi_of_logits(logits).clamp(-1 + PHI_MARGIN, 1 - PHI_MARGIN)
                lp = F1LPLoss().build_lp(phi, labels.to(dtype))
                sol = solve(lp.c, lp.A, lp.b, lp.A_eq, lp.b_eq)
                ours = float((lp.c.double() * sol.z.detach().double()).sum())
                a = [t.detach().cpu().double().numpy() for t in (lp.c, lp.A, lp.b, lp.A_eq,
                                                                 lp.b_eq)]
                ref = highs(a[0], sp.csr_matrix(a[1]), a[2], sp.csr_matrix(a[3]), a[4])[1]
            errs.append(abs(ours - ref) / max(abs(ref), 1e-12))
            refs.append(ref)
        out[dname] = {"err": max(errs), "highs_seed0": refs[0]}
    return out


def run_worker(spec):
    torch.manual_seed(0)
    _mallopt(128 * 1024, 128 * 1024)         # before any allocation: see peak_memory_mb
    return accuracy(spec) if spec["method"] == "accuracy" else measure(spec)


def run_cell(spec, in_process=False):
    """Run one cell in a fresh subprocess (or here); returns its result dict or an error."""
    if in_process:
        return run_worker(spec)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(spec)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=CELL_TIMEOUT_S,
                              cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"skipped": f"timed out (> {CELL_TIMEOUT_S} s)"}
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


def cells(auc_sizes, f1_sizes):
    for pos in POSITIVES:
        for size in auc_sizes:
            for method in AUC_METHODS + ["accuracy"]:
                yield {"problem": "auc", "positives": pos, "size": size, "method": method,
                       "measure": pairs_of(size, POSITIVES[pos])}
    for size in f1_sizes:
        for method in F1_METHODS + ["accuracy"]:
            yield {"problem": "f1", "positives": "-", "size": size, "method": method,
                   "measure": size}


def run_benchmark(auc_sizes, f1_sizes, dtype="float32", device="cpu", cap_s=30.0,
                  in_process=False, log=print):
    """All cells in order of size; returns ``{(problem, positives, size, method): result}``."""
    results, last, dead = {}, {}, {}
    for spec in cells(auc_sizes, f1_sizes):
        spec.update(dtype=dtype, device=device, cap_s=cap_s,
                    seeds=3 if spec["measure"] <= 100_000 else 1)
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


# -------------------------------------------------------------------------------- report
def fmt_ms(res):
    if "skipped" in res:
        s = res["skipped"]
        return s if s.startswith(("skipped", "timed out", "-")) else f"skipped ({s})"
    if "median_ms" not in res:
        return "failed: " + res.get("error", "?").split("Error: ", 1)[-1][:120]
    t = res["median_ms"]
    s = f"{t:.0f}" if t >= 100 else f"{t:.1f}" if t >= 10 else f"{t:.2f}"
    return f"{s} ({len(res['times_ms'])})"


def fmt_mb(res):
    mb = res.get("peak_mb")
    if mb is None:
        return "-"
    return "n/a (1 call)" if math.isnan(mb) else f"{mb:.1f}" if mb < 100 else f"{mb:.0f}"


def rel_err(res, acc, dtype):
    if "value" not in res or not acc or dtype not in acc:
        return None
    ref = acc[dtype]["highs_seed0"]
    return abs(res["value"] - ref) / max(abs(ref), 1e-12)


def fmt_err(e):
    return "-" if e is None else f"{e:.1e}"


def code_version():
    """Git commit plus a hash of the measured sources (solver/ and the LP builders may be
    edited between runs: the hash says which version a table measured)."""
    import hashlib
    files = sorted((ROOT / "solver").glob("*.py")) + [ROOT / p for p in (
        "objectives/pairwise.py", "objectives/auc.py", "objectives/fractional.py",
        "objectives/ratio.py", "objectives/common.py", "baselines/cvxpy_lp.py")]
    digest = hashlib.sha256(b"".join(f.read_bytes() for f in files if f.exists())).hexdigest()
    try:
        git = lambda *a: subprocess.run(["git", "-C", str(ROOT), *a], capture_output=True,  # noqa: E731
                                        text=True, timeout=10).stdout.strip()
        head = git("rev-parse", "--short", "HEAD") or "?"
        dirty = git("status", "--porcelain", "solver", "objectives", "baselines")
    except (OSError, subprocess.SubprocessError):
        head, dirty = "?", ""
    return f"git {head}{' + uncommitted changes' if dirty else ''}; sources sha256 {digest[:12]}"


def machine_info():
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo")
                if ln.startswith("model name")), platform.processor())
    import scipy
    versions = [f"torch {torch.__version__}", f"scipy {scipy.__version__} (HiGHS)"]
    for name in ("cvxpy", "cvxpylayers"):   # absent on a bare GPU image: those cells then error
        try:
            versions.append(f"{name} {__import__(name).__version__}")
        except ImportError:
            versions.append(f"{name} not installed")
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "none"
    return {"cpu": cpu, "cores": os.cpu_count(), "code": code_version(), "threads": torch.get_num_threads(),
            "omp": os.environ.get("OMP_NUM_THREADS", "unset"), "gpu": gpu,
            "load": " ".join(f"{x:.1f}" for x in os.getloadavg()),
            "versions": ", ".join(versions + [f"python {platform.python_version()}"])}


def targets(R, dtype):
    """The issue's targets: (target, measured, met) rows."""
    rows = []
    g = lambda *k: R.get(k, {})                                      # noqa: E731
    ours, cvx = g("auc", "balanced", 64, "ours"), g("auc", "balanced", 64, "cvxpylayers")
    if "median_ms" in ours:
        t = ours["median_ms"]
        rows.append(("AUC LP, batch 64 (balanced, 1024 pairs): ours fwd+bwd <= 2 ms",
                     f"{t:.2f} ms ({t / 2:.2f}x the target)", t <= 2))
        if "median_ms" in cvx:
            r = cvx["median_ms"] / t
            rows.append(("AUC LP, batch 64: >= 10x faster than cvxpylayers (same run)",
                         f"{r:.1f}x ({cvx['median_ms']:.1f} ms vs {t:.2f} ms)", r >= 10))
    big = g("auc", "balanced", 4096, "ours")
    if "median_ms" in big:
        t, mb = big["median_ms"], big["peak_mb"]
        rows.append(("AUC LP, batch 4096 (4.2 M pairs): fwd+bwd < 2 s",
                     f"{t / 1e3:.2f} s ({t / 2e3:.2f}x the target)", t < 2000))
        rows.append(("AUC LP, batch 4096: peak memory < 1 GB (1024 MiB)",
                     f"{mb:.0f} MiB ({mb / 1024:.2f}x the target)", mb < 1024))
    f1, hi = g("f1", "-", 64, "ours"), g("f1", "-", 64, "highs")
    if "median_ms" in f1 and "median_ms" in hi:
        r = hi["median_ms"] / f1["median_ms"]
        rows.append(("F1 LP, n = 64: ours fwd+bwd faster than HiGHS forward",
                     f"{f1['median_ms']:.2f} ms vs {hi['median_ms']:.2f} ms (HiGHS/ours "
                     f"= {r:.2f}x)", r > 1))
    for dt in ("float64", "float32"):
        errs = [v[dt]["err"] for k, v in R.items() if k[3] == "accuracy" and dt in v]
        if errs:
            rows.append((f"objective error of ours vs HiGHS <= 1e-6 everywhere ({dt})",
                         f"max {max(errs):.1e} over {len(errs)} rows", max(errs) <= 1e-6))
    return rows


def write_report(R, meta, out: Path, stem: str):
    out.mkdir(parents=True, exist_ok=True)
    dt = meta["dtype"]
    L = ["# Solver benchmark: AUC LP and F1 LP (Meng et al. 2021, fig. 3)", "",
         f"Command: `{meta['command']}`  ", f"Date: {meta['date']}  ",
         f"Machine: {meta['cpu']}, {meta['cores']} logical cores, torch threads "
         f"{meta['threads']} (OMP_NUM_THREADS={meta['omp']}); shared machine, load average "
         f"at start {meta['load']}  ", f"Software: {meta['versions']}  ",
         f"Code: {meta.get('code', '?')}  ",
         f"Device {meta['device']}, dtype {dt} (timings, memory); epsilon = {EPS}.", "",
         "Time = median wall time of one forward + backward (`sum(z * w)`, random `w`, "
         "w.r.t. the scores / logits) over (n) calls after warm-up, each (method, size) in "
         "a fresh subprocess; HiGHS is forward only (``linprog(method='highs')``, constraint "
         "matrix prebuilt as scipy CSR outside the timer). Peak memory (MiB) = resident-set "
         "high-water mark of the call after the warm-up above the RSS before it (glibc set to "
         "mmap blocks > 128 KiB, so memory freed by the warm-up has left the process; on CUDA "
         "`max_memory_allocated`). Objective error = |v - v_HiGHS| / |v_HiGHS| on the same "
         "rounded data.", "", "## Targets", "",
         "| target | measured | met |", "|---|---|---|"]
    L += [f"| {a} | {b} | {'yes' if c else '**no**'} |" for a, b, c in targets(R, dt)]
    sizes = sorted({k[2] for k in R if k[0] == "auc"})
    acc = lambda *k: R.get(k + ("accuracy",), {})                   # noqa: E731
    for title, fmt in (("median fwd+bwd time, ms (calls)", fmt_ms), ("peak memory, MiB", fmt_mb)):
        L += ["", f"## (a) binary-AUC LP: {title}", "",
              "| positives | batch | pairs | " + " | ".join(LABELS[m] for m in AUC_METHODS)
              + (" | cvxpylayers / ours |" if fmt is fmt_ms else " |"),
              "|---|---:|---:|" + "---:|" * (len(AUC_METHODS) + (fmt is fmt_ms))]
        for pos in POSITIVES:
            for b in sizes:
                row = [fmt(R.get(("auc", pos, b, m), {"skipped": "-"})) for m in AUC_METHODS]
                if fmt is fmt_ms:
                    o, c = R.get(("auc", pos, b, "ours"), {}), R.get(("auc", pos, b, "cvxpylayers"), {})
                    row.append(f"{c['median_ms'] / o['median_ms']:.0f}x"
                               if "median_ms" in o and "median_ms" in c else "-")
                L.append(f"| {pos} | {b} | {pairs_of(b, POSITIVES[pos])} | " + " | ".join(row) + " |")
    L += ["", "## (a) binary-AUC LP: relative objective error vs HiGHS", "",
          "ours: max over seeds (3 instances up to 100k pairs, else 1), float64 and float32 "
          f"data; other methods: the timed instance in {dt}.", "",
          "| positives | batch | ours float64 | ours float32 | cvxpylayers | dense paper recipe "
          "| closed form |", "|---|---:|---:|---:|---:|---:|---:|"]
    for pos in POSITIVES:
        for b in sizes:
            a = acc("auc", pos, b)
            o = [fmt_err(a[d]["err"]) if d in a else fmt_ms(a) if a else "-"
                 for d in ("float64", "float32")]
            e = [fmt_err(rel_err(R.get(("auc", pos, b, m), {}), a, dt))
                 for m in ("cvxpylayers", "dense_paper", "closed_form")]
            L.append(f"| {pos} | {b} | " + " | ".join(o + e) + " |")
    L += ["", "## (b) F1 LP (seed 001 §2.4; n samples -> n + 1 variables)", "",
          "| n | ours fwd+bwd ms | HiGHS fwd ms | cvxpylayers fwd+bwd ms | HiGHS / ours | "
          "ours MiB | HiGHS MiB | cvxpylayers MiB | err ours f64 | err ours f32 | "
          "err cvxpylayers |", "|---:|" + "---:|" * 10]
    for n in sorted({k[2] for k in R if k[0] == "f1"}):
        r = {m: R.get(("f1", "-", n, m), {}) for m in F1_METHODS}
        a = acc("f1", "-", n)
        ratio = f"{r['highs']['median_ms'] / r['ours']['median_ms']:.1f}x" \
            if "median_ms" in r["ours"] and "median_ms" in r["highs"] else "-"
        cols = [fmt_ms(r["ours"]), fmt_ms(r["highs"]), fmt_ms(r["cvxpylayers"]), ratio] + \
            [fmt_mb(r[m]) for m in F1_METHODS] + \
            [fmt_err(a[d]["err"]) if d in a else "-" for d in ("float64", "float32")] + \
            [fmt_err(rel_err(r["cvxpylayers"], a, dt))]
        L.append(f"| {n} | " + " | ".join(cols) + " |")
    solver = sorted({f"{k[0]}: " + json.dumps(v["stats"], sort_keys=True) for k, v in R.items()
                     if k[3] == "ours" and v.get("stats")})
    L += ["", "## Notes", "",
          "* ours = `solver.solve_lp` with default options, called through "
          "`objectives.pairwise.ramp_lp` (AUC, `A = -I` as `DiagonalOperator`) and "
          "`objectives.ratio.F1LPLoss` (F1), i.e. exactly the training LPs; solver stats seen: "
          + "; ".join(f"`{s}`" for s in solver) + ".",
          "* cvxpylayers = `baselines.cvxpy_lp.CvxpyLP` / `F1CvxpyLoss` (SCS, default "
          "tolerances 1e-4, diagonal `A` parameter for AUC, 1 job); the first (compiling) call "
          "is the untimed warm-up. From ~50k pairs it fails before solving: cvxpy's "
          "canonicalisation of the diagonal-parameter problem allocates an int64 index array "
          "of ~(pairs)^2 entries (the `failed:` cells).",
          "* dense paper recipe = the authors' AUC code re-implemented: materialised "
          "`A = [-I; -I]` (2TN x TN), ridge start, 20 Newton steps with a dense inverse of "
          "`A^T D A + 1e-4 I`, primal from the active rows with ridge 0.01, autograd through all; "
          "its objective error reflects the ridge bias (z scaled by 1/1.01).",
          f"* A cell whose first call exceeds {meta['cap_s']:.0f} s is reported from that single "
          "call (no memory run); cvxpylayers / dense are skipped beyond such a size, and where "
          "extrapolation from the previous size says so.", ""]
    (out / f"{stem}.md").write_text("\n".join(L))
    plot(R, out / f"{stem}.png", meta)
    (out / f"{stem}.json").write_text(json.dumps(
        {"meta": meta, "results": [{"key": list(k), **v} for k, v in R.items()]}, indent=1))


def plot(R, path, meta):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker
    panels = [("auc", "balanced", AUC_METHODS, "AUC LP, balanced", "batch size"),
              ("auc", "91%", AUC_METHODS, "AUC LP, 91% positives", "batch size"),
              ("f1", "-", F1_METHODS, "F1 LP", "n (samples)")]
    fig, axes = plt.subplots(1, 3, figsize=(16, 5))
    styles = {"ours": ("C0", "o", "-"), "cvxpylayers": ("C1", "s", "-"),
              "highs": ("C2", "^", "--"), "dense_paper": ("C3", "D", "-"),
              "closed_form": ("C7", "x", ":")}
    for ax, (prob, pos, methods, title, xlabel) in zip(axes, panels):
        for m in methods:
            pts = sorted((k[2], v["median_ms"]) for k, v in R.items()
                         if k[:2] == (prob, pos) and k[3] == m and "median_ms" in v)
            if pts:
                col, mk, ls = styles[m]
                ax.plot(*zip(*pts), color=col, marker=mk, linestyle=ls, label=LABELS[m])
        if prob == "auc":
            ax.axhline(2.0, color="k", lw=0.6, ls=":")
            ax.annotate("2 ms target (batch 64)", (0.01, 2.0), xycoords=("axes fraction", "data"),
                        fontsize=8, va="bottom")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        xs = sorted({k[2] for k in R if k[:2] == (prob, pos)})
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        ax.yaxis.set_major_locator(matplotlib.ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
        ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set(title=title, xlabel=xlabel, ylabel="median time per call, ms (log scale)")
        ax.grid(True, which="major", alpha=0.3)
    handles = {h.get_label(): h for ax in axes for h in ax.get_lines() if h.get_label()[0] != "_"}
    if handles:  # none when every cell failed
        fig.legend(handles.values(), handles.keys(), loc="lower center", ncol=len(handles),
                   fontsize=9, frameon=False)
    fig.suptitle(f"fwd+bwd time (HiGHS: forward only), {meta['device']} {meta['dtype']}, "
                 f"{meta['threads']} thread(s): {meta['cpu']}", fontsize=10)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="sizes 32 and 64 only (smoke test)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"],
                    help="dtype of the timed runs (errors are always reported in both)")
    ap.add_argument("--out", default=str(ROOT / "results" / "solver"))
    ap.add_argument("--cap", type=float, default=30.0, help="seconds per call before skipping")
    ap.add_argument("--report-from", metavar="JSON",
                    help="rewrite the .md/.png from a saved run's .json (no measuring)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(run_worker(json.loads(args.worker))), flush=True)
        return
    if args.report_from:
        saved = json.loads(Path(args.report_from).read_text())
        R = {tuple(r.pop("key")): r for r in saved["results"]}
        write_report(R, saved["meta"], Path(args.out), Path(args.report_from).stem)
        return
    meta = {**machine_info(), "dtype": args.dtype, "device": args.device, "cap_s": args.cap,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "command": f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '')} python "
                       + " ".join(shlex.quote(a) for a in ["scripts/bench_solver.py"] + sys.argv[1:])}
    sizes = ([32, 64], [32, 64]) if args.quick else (AUC_SIZES, F1_SIZES)
    R = run_benchmark(*sizes, dtype=args.dtype, device=args.device, cap_s=args.cap,
                      log=lambda s: print(s, file=sys.stderr, flush=True))
    stem = "solver_bench_quick" if args.quick else "solver_bench"
    write_report(R, meta, Path(args.out), stem)
    print(f"wrote {Path(args.out) / stem}.md/.png/.json", file=sys.stderr)


if __name__ == "__main__":
    main()
