"""ms per forward + backward of the batch-64 binary-AUC LP: the standard solver path against the
capture-safe one (``solve_lp(..., capture_safe=True)``, solver/capture/separable.py), side by side in one
process (interleaved rounds, median of each); on CUDA also the capture-safe step captured in a
CUDA graph (``torch.cuda.graph``) and replayed.  ``--compile`` adds the capture-safe step
compiled by inductor (``torch.compile(fullgraph=True)``, which only the capture-safe path allows:
the standard one breaks the graph at every host check), and on CUDA that compiled step captured
in a CUDA graph too.  Run on an H100 without ``--compile`` on 2026-11-27 (``results/solver/README.md``
section 11); the compiled rows not yet on a GPU.

    OMP_NUM_THREADS=1 python -m scripts.solver.time_capture_lp [--device cuda] [--batch 64] [--compile]

The LP is the one ``objective=auc_lp`` solves every step: softmax scores of ``batch`` samples
(half positive), margins of all positive-negative pairs (1,024 at batch 64), ``A = -I`` as a
``DiagonalOperator``, eps 0.01; the timed call is ``solve_lp`` + ``backward`` of the ramp loss to
the margins.  Prints one JSON line per path.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from lpmetrics.objectives.auc import auc_pairs
from lpmetrics.packed.speed import warm_on_side_stream
from lpmetrics.solver import DiagonalOperator, solve_lp

EPS = 0.01


def margins(batch: int, device, dtype, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    s = torch.sigmoid(2 * torch.randn(batch, generator=g))
    y = torch.arange(batch) % 2
    return auc_pairs(s, y).to(device=device, dtype=dtype)


def loss_of(d: torch.Tensor, capture_safe: bool) -> torch.Tensor:
    z = solve_lp(torch.ones_like(d), DiagonalOperator(-torch.ones_like(d)), d - EPS,
                 capture_safe=capture_safe).z
    return 1.0 - torch.relu(EPS - z).mean() / EPS


def step_fn(d: torch.Tensor, capture_safe: bool, compiled=None):
    loss = compiled or (lambda x: loss_of(x, capture_safe))

    def step():
        loss(d).backward()
    return step


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_rounds(fns: dict, device, repeats: int, rounds: int) -> dict:
    """Median ms per call of each fn, rounds interleaved so load drifts hit all alike."""
    out = {k: [] for k in fns}
    for fn in fns.values():     # warm-up
        for _ in range(3):
            fn()
    sync(device)
    for _ in range(rounds):
        for name, fn in fns.items():
            sync(device)
            t0 = time.perf_counter()
            for _ in range(repeats):
                fn()
            sync(device)
            out[name].append(1e3 * (time.perf_counter() - t0) / repeats)
    return {k: statistics.median(v) for k, v in out.items()}


def graph_fn(step, d):
    """Capture ``step`` in a CUDA graph (warm-up on a side stream, as the PyTorch docs do);
    returns ``graph.replay``."""
    def fresh_step():
        d.grad = None
        step()
    warm_on_side_stream(fresh_step, d.device)
    graph = torch.cuda.CUDAGraph()
    d.grad = None
    with torch.cuda.graph(graph):
        step()
    return graph.replay


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    p.add_argument("--repeats", type=int, default=50)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--compile", action="store_true",
                   help="also the inductor-compiled capture-safe step (~1.5 min to compile)")
    args = p.parse_args()
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    base = margins(args.batch, device, dtype)
    d_std, d_cap = (base.clone().requires_grad_(True) for _ in range(2))
    fns = {"standard": step_fn(d_std, False), "capture_safe": step_fn(d_cap, True)}
    compile_s = None
    if args.compile:
        d_c = base.clone().requires_grad_(True)
        compiled = torch.compile(lambda x: loss_of(x, True), fullgraph=True)
        t0 = time.perf_counter()
        step_fn(d_c, True, compiled)()
        sync(device)
        compile_s = round(time.perf_counter() - t0, 1)
        fns["capture_safe_compiled"] = step_fn(d_c, True, compiled)
    ms = time_rounds(fns, device, args.repeats, args.rounds)
    status = "cpu: no CUDA graph"
    if device.type == "cuda":
        status = {}
        graphs = {"capture_safe_graph": None}
        if args.compile:
            graphs["capture_safe_compiled_graph"] = compiled
        for key, fn in graphs.items():
            d_g = base.clone().requires_grad_(True)
            try:
                ms.update(time_rounds({key: graph_fn(step_fn(d_g, True, fn), d_g)}, device,
                                      args.repeats, args.rounds))
                status[key] = "captured"
            except Exception as exc:   # report, keep the eager numbers
                status[key] = f"capture failed: {type(exc).__name__}: " \
                              f"{str(exc).splitlines()[0][:200]}"
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    for path, v in ms.items():
        print(json.dumps({"path": path, "ms_fwd_bwd": round(v, 4), "batch": args.batch,
                          "pairs": base.numel(), "dtype": args.dtype, "device": name,
                          "threads": torch.get_num_threads(), "graph": status,
                          "compile_s": compile_s}))


if __name__ == "__main__":
    main()
