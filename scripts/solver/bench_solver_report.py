"""Reporting side of the solver benchmark (entry point and method: ``scripts/solver/bench_solver.py``):
table cell formatting, code version and machine description, the targets, the Markdown / PNG /
JSON report (:func:`write_report`, :func:`plot`) and the ``--report-from`` redraw
(:func:`report_from`)."""
from __future__ import annotations

import json
import math
import os
import platform
import subprocess
from pathlib import Path

import torch

from scripts.solver.bench_solver_measure import (AUC_METHODS, EPS, F1_METHODS, POSITIVES, ROOT,
                                  SPARSE_METHODS, pairs_of)

LABELS = {"ours": "ours (Newton, structured A)", "ours_csr": "ours, A as torch.sparse CSR",
          "ours_dense": "ours, A dense", "newton": "ours (Newton forward)",
          "newton_highs": "ours, forward='highs'", "cvxpylayers": "cvxpylayers (SCS)",
          "highs": "HiGHS (forward only)", "dense_paper": "dense paper recipe",
          "closed_form": "closed form max(0, eps-d)"}


def write_outputs(out, stem: str, data, markdown: str, draw) -> None:
    """``<out>/<stem>.json`` (raw numbers), ``.md`` (the table), ``.png`` (``draw(path)``), and
    the table printed: the outputs every solver figure script writes."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(data, indent=1))
    (out / f"{stem}.md").write_text(markdown + "\n")
    draw(out / f"{stem}.png")
    print(markdown)


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


def issue11_targets(R):
    """The benchmark's targets (structured-path rows compare with the earlier baseline,
    1.74 s / 464 MiB)."""
    rows = []
    g = lambda *k: R.get(k, {}).get("median_ms")                      # noqa: E731
    csr, cvx = g("auc", "balanced", 64, "ours_csr"), g("auc", "balanced", 64, "cvxpylayers")
    if csr and cvx:
        rows.append(("AUC LP, 1,024 pairs, A as torch.sparse CSR: fwd+bwd >= 5x faster than "
                     "cvxpylayers", f"{cvx / csr:.2f}x ({csr:.1f} ms vs {cvx:.1f} ms)",
                     cvx / csr >= 5))
    for n in sorted({k[2] for k in R if k[0] == "sparse"}):
        new, hf, hi = (g("sparse", "-", n, m) for m in SPARSE_METHODS)
        if not hi:
            continue
        for label, t, bound in (("Newton", new, 5.0), ("forward='highs'", hf, 1.5)):
            res = R.get(("sparse", "-", n, "newton" if bound == 5.0 else "newton_highs"), {})
            rows.append((f"random sparse LP n = {n}: {label} fwd+bwd <= {bound:g}x HiGHS fwd",
                         f"{t / hi:.2f}x ({t:.0f} ms vs {hi:.0f} ms)" if t else fmt_ms(res),
                         bool(t) and t / hi <= bound))
        acc = R.get(("sparse", "-", n, "accuracy"), {}).get("float64")
        if acc:
            rows.append((f"random sparse LP n = {n}: Newton objective within 1e-6 of HiGHS",
                         f"{acc['err']:.1e}", acc["err"] <= 1e-6))
    f1 = g("f1", "-", 64, "ours")
    if f1:
        rows.append(("F1 LP, n = 64: fwd+bwd <= 1 ms (one CPU thread)",
                     f"{f1:.2f} ms ({f1:.2f}x the target)", f1 <= 1))
    big = R.get(("auc", "balanced", 4096, "ours"), {})
    if "median_ms" in big:
        t, mb = big["median_ms"], big["peak_mb"]
        rows.append(("structured path not slower: AUC LP batch 4096 <= 1.74 s",
                     f"{t / 1e3:.2f} s ({t / 1740:.2f}x)", t <= 1740))
        rows.append(("structured path not bigger: AUC LP batch 4096 <= 464 MiB",
                     f"{mb:.0f} MiB ({mb / 464:.2f}x)", mb <= 464))
    return rows


def write_report(R, meta, out: Path, stem: str):
    out.mkdir(parents=True, exist_ok=True)
    dt = meta["dtype"]
    L = ["# Solver benchmark: AUC LP, F1 LP, random sparse LPs (Meng et al. 2021, fig. 3)",
         "",
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
    L += [f"| {a} | {b} | {'yes' if c else '**no**'} |" for a, b, c in issue11_targets(R)]
    L += ["", "## Earlier targets", "", "| target | measured | met |", "|---|---|---|"]
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
    L += ["", "## (b) F1 LP (Meng et al., ICLR 2021 version, §2.4; n samples -> n + 1 "
          "variables)", "",
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
    L += sparse_table(R)
    solver = sorted({f"{k[0]}: " + json.dumps(v["stats"], sort_keys=True) for k, v in R.items()
                     if k[3] == "ours" and v.get("stats")})
    L += ["", "## Notes", "",
          "* ours = `solver.solve_lp` with default options, called through "
          "`objectives.pairwise.ramp_lp` (AUC, `A = -I` as `DiagonalOperator`) and "
          "`objectives.ratio.F1LPLoss` (F1), i.e. exactly the training LPs; solver stats seen: "
          + "; ".join(f"`{s}`" for s in solver) + ".",
          "* ours, A as torch.sparse CSR / A dense = `solver.solve_lp(1, A, d - eps)` with "
          "`A = -I` given as a `torch.sparse_csr_tensor` / a dense tensor (the general paths a "
          "user without a structured operator gets; default options).",
          "* (c) ours = `solve_lp(c, A, b, A_eq, b_eq)` with `A, A_eq` as `torch.sparse` CSR, "
          "fwd+bwd of `sum(z * w)` w.r.t. `b`; forward='highs' = the same call with "
          "`forward='highs'` (HiGHS forward, our active-set backward).",
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


def sparse_table(R):
    ns = sorted({k[2] for k in R if k[0] == "sparse"})
    if not ns:
        return []
    L = ["", "## (c) random sparse LPs with equalities (float64; `random_sparse_lp`)", "",
         "| n | m (ineq.) | p (eq.) | Newton fwd+bwd ms | Newton steps, linear solver | "
         "forward='highs' fwd+bwd ms | HiGHS fwd ms | Newton / HiGHS | highs-fwd / HiGHS | "
         "err Newton f64 | Newton MiB | HiGHS MiB |", "|---:|" + "---:|" * 11]
    for n in ns:
        r = {m: R.get(("sparse", "-", n, m), {}) for m in SPARSE_METHODS}
        a = R.get(("sparse", "-", n, "accuracy"), {})
        st = r["newton"].get("stats", {})
        ratio = lambda m: (f"{r[m]['median_ms'] / r['highs']['median_ms']:.2f}x"  # noqa: E731
                           if "median_ms" in r[m] and "median_ms" in r["highs"] else "-")
        L.append(f"| {n} | {n // 2 + 1 + n} | {max(1, n // 50)} | {fmt_ms(r['newton'])} | "
                 f"{st.get('iterations', '-')}, {st.get('linear_solver', '-')} | "
                 f"{fmt_ms(r['newton_highs'])} | {fmt_ms(r['highs'])} | {ratio('newton')} | "
                 f"{ratio('newton_highs')} | "
                 f"{fmt_err(a['float64']['err']) if 'float64' in a else fmt_ms(a) if a else '-'}"
                 f" | {fmt_mb(r['newton'])} | {fmt_mb(r['highs'])} |")
    return L


def plot(R, path, meta):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker
    panels = [("auc", "balanced", AUC_METHODS, "AUC LP, balanced", "batch size"),
              ("auc", "91%", AUC_METHODS, "AUC LP, 91% positives", "batch size"),
              ("f1", "-", F1_METHODS, "F1 LP", "n (samples)"),
              ("sparse", "-", SPARSE_METHODS, "random sparse LP (float64)", "n (variables)")]
    panels = [p for p in panels if any(k[:2] == p[:2] for k in R)]
    fig, axes = plt.subplots(1, len(panels), figsize=(5.4 * len(panels), 5), squeeze=False)
    axes = axes[0]
    styles = {"ours": ("C0", "o", "-"), "ours_csr": ("C4", "v", "-"),
              "ours_dense": ("C5", "P", "-"), "newton": ("C0", "o", "-"),
              "newton_highs": ("C9", "*", "-"), "cvxpylayers": ("C1", "s", "-"),
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


def report_from(path, out):
    """Rewrite the .md/.png/.json of a saved run's ``.json`` into ``out`` (no measuring)."""
    saved = json.loads(Path(path).read_text())
    R = {tuple(r.pop("key")): r for r in saved["results"]}
    write_report(R, saved["meta"], Path(out), Path(path).stem)
