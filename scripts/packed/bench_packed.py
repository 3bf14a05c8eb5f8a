"""Packed ResNet-18 training steps against N: ms/step, TFLOP/s, memory, and the paper tables' wall time.

For every pack size N, image size (32 px: CIFAR-10/100; 50 px: Cat&Dog), objective
(``ce``, ``auc_lp``) and precision (fp32, bf16 autocast), one fresh subprocess builds N runs of
``configs/model/resnet18.yaml`` (batch 64, SGD as ``optimizer=sgd``) twice -- as one pack
(:class:`packed.PackedStep`) and as N separate models stepped in turn -- and times both
alternately (:func:`packed.speed.interleaved_ms`, median of ``--reps``), so the packed/separate
ratio is measured side by side. It also records the step's peak memory for each (CUDA
``max_memory_allocated``; CPU peak-RSS delta, which is why each cell is its own process) and, on
CUDA, tries to capture the sync-free packed step in a CUDA graph (the reason is recorded when it
cannot). Each cell times four modes: packed (eager, one finiteness read per run and step), packed
sync-free (:class:`packed.PackedStep`'s sync-free mode), the same with one pack-wide SGD update
instead of N per-run optimizers (:class:`packed.optim.PackedSGD`; "–" where the runs' optimizer is
not plain SGD, e.g. PPD) and separate; beside them, the eager packed step with each pack
forward of ``--forwards`` (:data:`packed.model.MODES`: ``vmap``'s grouped convolutions, ``loop``'s
per-run kernels, ``gemm``'s batched GEMMs over the runs, :mod:`packed.gemm`, ``streams``' per-run CUDA streams), reported as
``gemm/vmap``; ``--pack-mode`` picks the forward of the packed, sync-free and graph columns
(default ``auto``: vmap on CUDA, loop on the CPU). On CUDA it captures the sync-free step both ways (pack-wide
update first). Optimizers come from the composed config (``objective=ppd_sg`` brings
``optimizer=ppd_sg``), and the packed runs train the objective form the launcher picks on that
device (:func:`packed.graph.capture_form`: ``auc_lp`` dense and capture-safe on CUDA); the
separate runs train the configured one, as ``train.py`` would.
FLOPs per run-step are counted with ``torch.utils.flop_counter.FlopCounterMode`` on one forward +
backward of one model (convolutions and matmuls; the optimizer and the LP solver are not counted),
and of one run of the ``gemm`` pack, which skips the taps that meet only padding; every TFLOP/s
column uses the model's count.

    OMP_NUM_THREADS=1 python -m scripts.packed.bench_packed --device cpu --budget-s 1200
    python -m scripts.packed.bench_packed --device cuda --budget-s 420          # N = 1 8 24 48 96

N that cannot fit are skipped with the reason: on the CPU N > 8 unless ``--n`` names them; any N
whose predicted time exceeds what is left of ``--budget-s``; any N above one that ran out of
memory. Writes ``README``-ready ``bench.md`` and ``bench.json`` to ``--out``. The projection of
each paper table (run counts from ``configs/experiment/*.yaml``, 40k steps) uses the fastest
measured ms per run at each image size; sizes not measured (STL-10's 96 px) are scaled from the
largest measured size by their counted FLOPs.
"""
from __future__ import annotations

import argparse
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

import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from torch.utils.flop_counter import FlopCounterMode

ROOT = Path(__file__).resolve().parents[2]

from hydra.utils import instantiate

from lpmetrics.run.builders import instantiate_runtime
from lpmetrics.packed import PackError, pack
from lpmetrics.packed.graph import capture_form
from lpmetrics.packed.optim import PackedSGD, unsupported
from lpmetrics.packed.speed import build_runs, graph_ms, interleaved_ms, peak_memory_mb

DEFAULT_N = [1, 8, 24, 48, 96]
FORWARDS = ["vmap", "loop", "gemm", "streams"]   # pack forwards timed side by side (packed.model.MODES)
# one CPU thread does a ResNet-18 step (32 px, batch 64) in ~0.25 s: N=24 packed + separate with
# warm-up and 3 reps is already ~1 min per cell and N=96 ~4 min, so the CPU default stops at 8
CPU_DEFAULT_MAX_N = 8
TABLES = ["table1_binary", "table2_multiclass", "table_f1", "table_eps"]
# image side per dataset (configs/dataset/*.yaml comments: CIFAR 32x32, catdog50 pack, STL-10 kept at 96x96)
IMAGE_PX = {"cifar10": 32, "cifar100": 32, "catdog": 50, "stl10": 96}
STEPS_PER_RUN = 40_000   # trainer.max_steps of every table (paper: 40k iterations)
CELL_KEYS = ["px", "objective", "dtype", "n", "status", "reason", "packed_ms", "sync_free_ms", "separate_ms",
             "packed_ms_per_run", "separate_ms_per_run", "ratio", "tflops_packed",
             "tflops_separate", "graph_ms", "graph_status", "mem_packed_mb", "mem_separate_mb",
             "mem_how", "wall_s", "objective_form", "sync_free_pack_ms", "graph_pack_ms",
             "graph_pack_status", "pack_mode", "vmap_ms", "loop_ms", "gemm_ms", "gemm_vs_vmap",
             "forwards_note"]


def compose_cfg(overrides: list[str]):
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        return compose("config", overrides=overrides)


def makers(model: str, objective: str, px: int, batch: int, extra: list[str]):
    """(make_model, make_objective, input shape, make_optimizer) as ``train.py`` builds them
    from the configs."""
    cfg = compose_cfg([f"model={model}", f"objective={objective}"] + extra)
    shape = [3, px, px]
    runtime = dict(num_classes=2, input_shape=shape, pos_ratio=0.5, class_counts=[batch // 2] * 2)
    return (lambda: instantiate_runtime(cfg.model, **runtime),
            lambda: instantiate_runtime(cfg.objective, **runtime), shape,
            lambda groups: instantiate(cfg.optimizer, _partial_=True)(params=groups))


def count_flops(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> int:
    """FLOPs of one forward + backward (CE loss) of ``model`` on ``(x, y)``, counted by
    ``FlopCounterMode`` (2 per multiply-add; the input needs no gradient, as in training)."""
    model.train()
    with FlopCounterMode(display=False) as counter:
        torch.nn.functional.cross_entropy(model(x), y).backward()
    model.zero_grad(set_to_none=True)
    return int(counter.get_total_flops())


def count_gemm_flops(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> int | None:
    """FLOPs of one run's forward + backward in a ``gemm`` pack (None: the mode refuses the model)."""
    try:
        packed = pack([model], "gemm")
    except PackError:
        return None
    with FlopCounterMode(display=False) as counter:
        torch.nn.functional.cross_entropy(packed(x[None])[0], y).backward()
    return int(counter.get_total_flops())


def time_forwards(st, step, spec: dict, device: torch.device) -> dict:
    """ms per eager packed step with each pack forward of ``spec["forwards"]``; the forward the
    pack already runs is the ``packed`` column, so only the others are timed (alternately)."""
    here = st.packed.mode if st.packed.mode != "auto" else ("vmap" if device.type == "cuda" else "loop")
    fns, notes = {}, []

    def with_mode(m):
        def run():
            st.packed.mode = m
            try:
                return step()
            finally:
                st.packed.mode = spec["pack_mode"]
        return run
    for m in spec["forwards"]:
        if m == here:
            continue
        if m == "streams" and st.update is not None:   # streams steps each run's own optimizer: not this pack's
            notes.append("streams: n/a here (it takes per-run updates; --pack-mode streams times it)")
            continue
        try:
            with_mode(m)()   # warm-up, and the refusal (PackError) of a mode the model lacks
            fns[m] = with_mode(m)
        except PackError as exc:
            notes.append(f"{m}: n/a ({str(exc)[:80]})")
    ms = interleaved_ms(fns, spec["reps"], device, warmup=0) if fns else {}
    return {**ms, "here": here, "note": "; ".join(notes)}


def run_cell(spec: dict, emit=None) -> dict:
    """Measure one (px, objective, dtype, N) cell in this process; returns a row of CELL_KEYS.
    ``emit(row)`` receives the row once before the CUDA-graph attempt, which can kill the process."""
    device = torch.device(spec["device"])
    make_model, make_objective, shape, make_optimizer = makers(spec["model"], spec["objective"], spec["px"],
                                                               spec["batch"], spec["set"])
    runs = build_runs(make_model, shape, spec["batch"], spec["n"], device, make_objective,
                      autocast=torch.bfloat16 if spec["dtype"] == "bf16" else None,
                      make_optimizer=make_optimizer, pack_form=lambda o: capture_form(o, device),
                      pack_update=False, mode=spec["pack_mode"])
    st = runs.stepper
    probe = make_objective()
    form = "as configured" if capture_form(probe, device) is probe else "capture-safe"
    pack_sgd = None if unsupported(st.packed, st.optimizers) else PackedSGD(st.packed, st.optimizers)

    def mode(sync_free: bool, update):   # the same pack, stepped one way or the other
        def step():
            st.sync_free, st.update = sync_free, update
            try:
                return runs.packed()
            finally:
                st.sync_free, st.update = False, None
        return step

    sync_free, sync_free_pack = mode(True, None), mode(True, pack_sgd)
    t0 = time.perf_counter()
    mem_p, how = peak_memory_mb(runs.packed, device)     # doubles as each mode's warm-up step
    mem_s, _ = peak_memory_mb(runs.separate, device)
    sync_free()
    fns = {"packed": runs.packed, "sync_free": sync_free, "separate": runs.separate}
    if pack_sgd is not None:
        sync_free_pack()
        fns["sync_free_pack"] = sync_free_pack
    ms = interleaved_ms(fns, spec["reps"], device, warmup=0)
    fwd = time_forwards(st, runs.packed, spec, device)
    fwd[fwd.pop("here")] = ms["packed"]
    n, flops = spec["n"], spec["flops"]
    row = dict(px=spec["px"], objective=spec["objective"], dtype=spec["dtype"], n=n, status="ok",
               reason="", packed_ms=ms["packed"], sync_free_ms=ms["sync_free"],
               separate_ms=ms["separate"],
               packed_ms_per_run=ms["packed"] / n, separate_ms_per_run=ms["separate"] / n,
               ratio=ms["packed"] / ms["separate"],
               tflops_packed=n * flops / ms["packed"] / 1e9,
               tflops_separate=n * flops / ms["separate"] / 1e9,
               graph_ms=None, graph_status="not attempted", mem_packed_mb=mem_p,
               mem_separate_mb=mem_s, mem_how=how, wall_s=time.perf_counter() - t0,
               objective_form=form,
               sync_free_pack_ms=ms.get("sync_free_pack"), graph_pack_ms=None,
               graph_pack_status="n/a (optimizer not plain SGD)" if pack_sgd is None else "not attempted",
               pack_mode=spec["pack_mode"], vmap_ms=fwd.get("vmap"), loop_ms=fwd.get("loop"),
               gemm_ms=fwd.get("gemm"), forwards_note=fwd["note"],
               gemm_vs_vmap=fwd["gemm"] / fwd["vmap"] if fwd.get("gemm") and fwd.get("vmap") else None)
    if emit:
        emit(row)
    if pack_sgd is not None:   # the new path first: a failed capture can end the process
        row["graph_pack_ms"], row["graph_pack_status"] = graph_ms(sync_free_pack, spec["reps"], device)
        if emit:
            emit(row)
    row["graph_ms"], row["graph_status"] = graph_ms(sync_free, spec["reps"], device)  # last
    row["wall_s"] = time.perf_counter() - t0
    return row


def skipped(spec: dict, reason: str) -> dict:
    row = {k: None for k in CELL_KEYS}
    row.update({k: spec[k] for k in ("px", "objective", "dtype", "n")}, status="skipped", reason=reason)
    return row


def run_cell_subprocess(spec: dict, timeout: float) -> dict:
    """``run_cell`` in a fresh process (clean peak memory; a crash or OOM kill is a reason)."""
    cmd = [sys.executable, "-m", "scripts.packed.bench_packed", "--cell", json.dumps(spec)]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return skipped(spec, f"stopped at the time budget ({timeout:.0f} s left)")
    rows = [line for line in out.stdout.splitlines() if line.startswith("{")]
    tail = (out.stderr.strip().splitlines() or ["no output"])[-1][:200]
    if rows and out.returncode != 0:   # eager numbers came out; a graph attempt did not
        row = json.loads(rows[-1])
        key = "graph_pack_status" if row.get("graph_pack_status") == "not attempted" else "graph_status"
        return dict(row, **{key: f"process died in graph capture (rc {out.returncode}): {tail}"})
    if out.returncode != 0 or not rows:
        oom = out.returncode in (-9, 137) or "out of memory" in out.stderr.lower()
        return skipped(spec, ("out of memory: " if oom else f"failed (rc {out.returncode}): ") + tail)
    return json.loads(rows[-1])


def table_runs(name: str) -> dict[int, int]:
    """Runs of one paper table per image size, from its experiment file's sweep."""
    cfg = OmegaConf.load(ROOT / "configs" / "experiment" / f"{name}.yaml")
    params = dict(cfg.hydra.sweeper.params)
    datasets = str(params.pop("dataset", "")).split(",") if "dataset" in params else [
        next(v for d in cfg.defaults if isinstance(d, dict) or OmegaConf.is_dict(d)
             for k, v in d.items() if k.endswith("/dataset"))]
    per_dataset = math.prod(len(str(v).split(",")) for v in params.values())
    counts: dict[int, int] = {}
    for d in datasets:
        counts[IMAGE_PX[d]] = counts.get(IMAGE_PX[d], 0) + per_dataset
    return counts


def plan_skip(spec: dict, rows: list[dict], left: float, explicit_n: bool, on_cpu: bool) -> str:
    """Why this cell must not run (empty: run it)."""
    n = spec["n"]
    if on_cpu and not explicit_n and n > CPU_DEFAULT_MAX_N:
        return (f"CPU default stops at N={CPU_DEFAULT_MAX_N} (a batch-64 ResNet-18 step is 0.25-0.5 s "
                f"per run on one thread); pass --n {n} to run it")
    same = [r for r in rows if r["px"] == spec["px"] and r["dtype"] == spec["dtype"]]
    oom = [r["n"] for r in same if r["status"] == "skipped" and r["reason"].startswith("out of memory")]
    if oom and n > min(oom):
        return f"N={min(oom)} already ran out of memory at {spec['px']} px {spec['dtype']}"
    done = [r for r in rows if r["status"] == "ok" and r["dtype"] == spec["dtype"]]
    if done:   # ms per run-step per FLOP from the closest measured cell, times this cell's steps
        ref = max(done, key=lambda r: (r["px"] == spec["px"], r["n"]))
        timed = [v for v in (ref.get(f"{m}_ms") for m in FORWARDS) if v]   # one is the packed column
        extra = (sum(timed) - ref["packed_ms"]) / ref["n"] if timed else 0.0
        per_flop = (ref["packed_ms_per_run"] + ref["separate_ms_per_run"] + extra) / spec["flops_of"][ref["px"]]
        predicted = 5 + (spec["reps"] + 2) * n * per_flop * spec["flops"] / 1000
        if predicted > left:
            return f"predicted {predicted:.0f} s > {left:.0f} s left of --budget-s"
    return ""


def best_per_run(rows: list[dict], px: int, dtype: str, key: str) -> tuple[float, int] | None:
    """(ms per run, N) at the N with the lowest mean ``key`` over objectives, measured at ``px``."""
    by_n: dict[int, list[float]] = {}
    for r in rows:
        if r["status"] == "ok" and r["px"] == px and r["dtype"] == dtype and r.get(key) is not None:
            by_n.setdefault(r["n"], []).append(r[key] / (r["n"] if key.endswith("_ms") else 1))
    if not by_n:
        return None
    n = min(by_n, key=lambda k: sum(by_n[k]) / len(by_n[k]))
    return sum(by_n[n]) / len(by_n[n]), n


def project(rows: list[dict], flops_of: dict[int, int]) -> list[dict]:
    """Hours of each paper table at 40k steps per run, one run after another on this device."""
    modes = [("separate fp32", "fp32", "separate_ms"), ("packed fp32", "fp32", "packed_ms"),
             ("packed bf16", "bf16", "packed_ms"), ("sync-free fp32", "fp32", "sync_free_ms"),
             ("sync-free bf16", "bf16", "sync_free_ms"), ("graph fp32", "fp32", "graph_ms"),
             ("graph bf16", "bf16", "graph_ms"), ("graph+pack-SGD fp32", "fp32", "graph_pack_ms"),
             ("graph+pack-SGD bf16", "bf16", "graph_pack_ms"), ("gemm fp32", "fp32", "gemm_ms"),
             ("gemm bf16", "bf16", "gemm_ms")]
    out = []
    for name in TABLES:
        counts = table_runs(name)
        row = {"table": name, "runs": counts, "hours": {}, "basis": {}}
        for label, dtype, key in modes:
            total, basis = 0.0, []
            for px, runs in sorted(counts.items()):
                measured = [p for p in flops_of if best_per_run(rows, p, dtype, key)]
                if not measured:
                    total = None
                    break
                src = px if px in measured else max(measured)
                ms, n = best_per_run(rows, src, dtype, key)
                ms *= flops_of[px] / flops_of[src]
                basis.append(f"{px}px: {ms:.1f} ms/run at N={n}" + ("" if src == px else f" (from {src}px by FLOPs)"))
                total += runs * STEPS_PER_RUN * ms / 1000 / 3600
            row["hours"][label] = total
            row["basis"][label] = "; ".join(basis) if total is not None else "not measured"
        out.append(row)
    return out


def ratio_by_n(rows: list[dict], key: str = "ratio") -> dict[str, dict]:
    """A time ratio (``key``: packed/separate, or ``gemm_vs_vmap``) per N over the measured
    cells: median, min, max, count."""
    out = {}
    for n in sorted({r["n"] for r in rows if r["status"] == "ok" and r.get(key) is not None}):
        ratios = sorted(r[key] for r in rows if r["status"] == "ok" and r["n"] == n and r.get(key) is not None)
        out[str(n)] = {"median": statistics.median(ratios), "min": ratios[0], "max": ratios[-1],
                       "cells": len(ratios)}
    return out


def machine(device: torch.device) -> dict:
    info = {"python": platform.python_version(), "torch": torch.__version__,
            "platform": platform.platform(), "cpu_count": os.cpu_count(),
            "threads": torch.get_num_threads(), "load_avg_at_start": [round(v, 1) for v in os.getloadavg()]}
    try:
        info["cpu"] = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                           if line.startswith("model name"))
    except (OSError, StopIteration):
        info["cpu"] = platform.processor()
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
        info["cuda"] = torch.version.cuda
    return info


def _f(v, fmt="{:.1f}"):
    return "–" if v is None else fmt.format(v)


def markdown(report: dict) -> str:
    lines = [f"Command: `{report['command']}`", "",
             "Machine: " + ", ".join(f"{k} {v}" for k, v in report["machine"].items()), "",
             "FLOPs per run-step (forward + backward, FlopCounterMode): " + ", ".join(
                 f"{px} px {f / 1e9:.2f} GFLOP" for px, f in report["flops"].items())
             + gemm_flops_note(report), "",
             "| px | objective | dtype | N | packed ms/step | sync-free ms/step | sync-free + pack SGD | "
             "separate ms/step | packed ms/run | packed/separate | TFLOP/s packed | TFLOP/s separate | "
             "graph ms/step | graph + pack SGD | TFLOP/s best graph | peak MB packed | peak MB separate | note |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    skips: dict[tuple[int, str], list[dict]] = {}
    for r in report["cells"]:
        if r["status"] != "ok" and r["packed_ms"] is None:
            skips.setdefault((r["n"], r["reason"]), []).append(r)
            continue
        note = r["reason"] if r["status"] != "ok" else r["graph_status"] if r["graph_ms"] is None \
            and not r["graph_status"].startswith("n/a") else ""
        graph = (_f(r["graph_ms"]) if r["graph_ms"] is not None or r["status"] != "ok" else
                 "n/a (CPU)" if r["graph_status"].startswith("n/a") else "failed (note)")
        graphs = [v for v in (r["graph_ms"], r.get("graph_pack_ms")) if v is not None]
        best = report["flops"][str(r["px"])] * r["n"] / min(graphs) / 1e9 if graphs else None
        if r.get("objective_form") == "capture-safe":
            note = (note + "; " if note else "") + "packed runs: capture-safe form"
        lines.append(f"| {r['px']} | {r['objective']} | {r['dtype']} | {r['n']} | {_f(r['packed_ms'])} | "
                     f"{_f(r.get('sync_free_ms'))} | {_f(r.get('sync_free_pack_ms'))} | {_f(r['separate_ms'])} | "
                     f"{_f(r['packed_ms_per_run'])} | {_f(r['ratio'], '{:.2f}')} | "
                     f"{_f(r['tflops_packed'], '{:.4f}')} | {_f(r['tflops_separate'], '{:.4f}')} | "
                     f"{graph} | {_f(r.get('graph_pack_ms'))} | {_f(best, '{:.2f}')} | {_f(r['mem_packed_mb'], '{:.0f}')} | "
                     f"{_f(r['mem_separate_mb'], '{:.0f}')} | {note} |")
    for (n, reason), rs in skips.items():
        what = " x ".join(", ".join(str(v) for v in sorted({r[k] for r in rs}, key=str)) + unit
                          for k, unit in (("px", " px"), ("objective", ""), ("dtype", "")))
        lines.append(f"\nSkipped N={n} ({what}): {reason}")
    lines += ["", "Packed / separate per run (median over objectives and dtypes; > 1 = packing slower): "
              + "; ".join(f"N={n}: {v['median']:.2f} ({v['min']:.2f}-{v['max']:.2f}, {v['cells']} cells)"
                          for n, v in report["ratio_by_n"].items())]
    lines += forwards_table(report)
    lines += ["", f"Projected wall time of each paper table ({STEPS_PER_RUN} steps per run, runs one "
              "after another on this device, evaluation not included), hours:", "",
              "| table | runs (by px) | " + " | ".join(report["projection"][0]["hours"]) + " |",
              "|---|---|" + "---|" * len(report["projection"][0]["hours"])]
    for p in report["projection"]:
        runs = ", ".join(f"{c}@{px}" for px, c in p["runs"].items())
        cpu = report["device"].startswith("cpu")
        lines.append(f"| {p['table']} | {runs} | " + " | ".join(
            "n/a (CPU)" if cpu and k.startswith("graph") else _f(h) for k, h in p["hours"].items()) + " |")
    lines += ["", "Basis of the projection: " + "; ".join(
        f"{k}: {v}" for k, v in report["projection"][0]["basis"].items())]
    return "\n".join(lines) + "\n"


def gemm_flops_note(report: dict) -> str:
    counted = {px: f for px, f in report.get("flops_gemm", {}).items() if f is not None}
    return ("; one run of the gemm pack computes " + ", ".join(
        f"{px} px {f / 1e9:.2f} GFLOP" for px, f in counted.items()) + " (taps that meet only padding "
        "skipped); TFLOP/s use the model's count") if counted else ""


def forwards_table(report: dict) -> list[str]:
    """The eager packed step with each pack forward, side by side (empty for old reports)."""
    rows = [r for r in report["cells"] if r["status"] == "ok" and "gemm_ms" in r]
    if not rows:
        return []
    lines = ["", "Pack forwards, eager packed step (same pack, timed alternately; the column of the "
             "pack's own forward is its packed ms/step):", "",
             "| px | objective | dtype | N | vmap ms/step | loop ms/step | gemm ms/step | gemm/vmap | "
             "TFLOP/s gemm | note |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        tflops = (int(report["flops"][str(r["px"])]) * r["n"] / r["gemm_ms"] / 1e9) if r["gemm_ms"] else None
        lines.append(f"| {r['px']} | {r['objective']} | {r['dtype']} | {r['n']} | {_f(r['vmap_ms'])} | "
                     f"{_f(r['loop_ms'])} | {_f(r['gemm_ms'])} | {_f(r['gemm_vs_vmap'], '{:.2f}')} | "
                     f"{_f(tflops, '{:.4f}')} | {r['forwards_note']} |")
    by_n = report.get("gemm_vs_vmap_by_n") or {}
    if by_n:
        lines += ["", "gemm / vmap per N (median over cells; < 1 = gemm faster): " + "; ".join(
            f"N={n}: {v['median']:.2f} ({v['min']:.2f}-{v['max']:.2f}, {v['cells']} cells)"
            for n, v in by_n.items())]
    return lines


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--n", type=int, nargs="+", default=None, help=f"pack sizes (default {DEFAULT_N})")
    ap.add_argument("--px", type=int, nargs="+", default=[32, 50], help="image sides (96 = STL-10)")
    ap.add_argument("--objectives", nargs="+", default=["ce", "auc_lp"],
                    help="configs/objective names, e.g. ce auc_lp ppd_sg ppd_adagrad (each with its own optimizer)")
    ap.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3, help="timed steps per mode (median)")
    ap.add_argument("--budget-s", type=float, default=900, help="wall budget of the whole sweep")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads per cell")
    ap.add_argument("--model", default="resnet18", help="configs/model/<name>.yaml")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="extra config overrides")
    ap.add_argument("--forwards", nargs="+", default=FORWARDS, choices=FORWARDS,
                    help="pack forwards timed side by side as eager packed steps")
    ap.add_argument("--pack-mode", default="auto", choices=["auto"] + FORWARDS,
                    help="forward of the packed / sync-free / graph columns (auto: vmap on CUDA, loop on CPU)")
    ap.add_argument("--inline", action="store_true", help="cells in this process (tests; memory then "
                    "depends on earlier cells)")
    ap.add_argument("--out", default="results/packed_bench")
    ap.add_argument("--render", metavar="BENCH_JSON", help="only rewrite bench.md/json from a saved bench.json")
    ap.add_argument("--cell", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse(argv)
    torch.set_num_threads(args.threads)
    if args.cell:
        def emit(row):
            print(json.dumps(row), flush=True)
        emit(run_cell(json.loads(args.cell), emit))
        return {}
    if args.render:   # a bench.json from another machine (e.g. a GPU slot's $OUT)
        return write(json.loads(Path(args.render).read_text()), Path(args.out))
    start, device = time.monotonic(), torch.device(args.device)
    flops_of, flops_gemm = {}, {}
    for px in sorted(set(args.px) | set(IMAGE_PX.values())):   # all table sizes: projection
        x, y = torch.randn(args.batch, 3, px, px), torch.randint(0, 2, (args.batch,))
        make_model = makers(args.model, "ce", px, args.batch, args.set)[0]
        flops_of[px] = count_flops(make_model(), x, y)
        if px in args.px:
            flops_gemm[str(px)] = count_gemm_flops(make_model(), x, y)
    rows: list[dict] = []
    report = {"schema": "bench_packed/1",
              "command": shlex.join(["python", "-m", "scripts.packed.bench_packed"] + list(argv if argv is not None else sys.argv[1:])),
              "device": args.device, "machine": machine(device),
              "settings": {k: getattr(args, k) for k in ("batch", "reps", "budget_s", "threads", "model", "set",
                                                          "forwards", "pack_mode")},
              "flops": {str(k): v for k, v in flops_of.items()}, "flops_gemm": flops_gemm, "cells": rows,
              "wall_s": 0.0}
    for n in args.n or DEFAULT_N:
        for px in args.px:
            for dtype in args.dtypes:
                for objective in args.objectives:
                    spec = dict(device=args.device, model=args.model, set=args.set, batch=args.batch,
                                reps=args.reps, px=px, objective=objective, dtype=dtype, n=n,
                                flops=flops_of[px], flops_of=flops_of, forwards=args.forwards,
                                pack_mode=args.pack_mode)
                    left = args.budget_s - (time.monotonic() - start)
                    why = plan_skip(spec, rows, left, args.n is not None, device.type == "cpu")
                    row = (skipped(spec, why) if why else run_cell(spec) if args.inline
                           else run_cell_subprocess(spec, timeout=max(left, 1)))
                    rows.append(row)
                    print(f"{px}px {objective} {dtype} N={n}: " + (
                        f"packed {row['packed_ms']:.1f} ms, sync-free {_f(row.get('sync_free_ms'))} ms, "
                        f"separate {row['separate_ms']:.1f} ms, ratio {row['ratio']:.2f}, vmap "
                        f"{_f(row['vmap_ms'])} / loop {_f(row['loop_ms'])} / gemm {_f(row['gemm_ms'])} ms, "
                        f"gemm/vmap {_f(row['gemm_vs_vmap'], '{:.2f}')}, graph "
                        f"{_f(row['graph_ms'])} ms ({row['graph_status'][:60]})"
                        if row["status"] == "ok" else row["reason"]), flush=True)
                    report["cells"], report["wall_s"] = rows, time.monotonic() - start
                    write(report, Path(args.out), echo=False)   # a killed sweep keeps its cells
    return write(report, Path(args.out))


def write(report: dict, out: Path, echo: bool = True) -> dict:
    """Add the derived parts (ratio per N, projection) and write bench.json + bench.md."""
    flops_of = {int(k): v for k, v in report["flops"].items()}
    report.update(ratio_by_n=ratio_by_n(report["cells"]), projection=project(report["cells"], flops_of),
                  gemm_vs_vmap_by_n=ratio_by_n(report["cells"], "gemm_vs_vmap"))
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / "bench.md").write_text(markdown(report))
    if echo:
        print(markdown(report))
    return report


if __name__ == "__main__":
    main()
