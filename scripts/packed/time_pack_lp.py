"""ms per forward + backward of k runs' ``auc_lp`` losses in a pack: one LP per run (what a pack
did until ``PackedStep(batch_losses=True)``) against one batched LP (``PairwiseRampLP.pack_forward``),
side by side in one process (interleaved rounds, median of each).

    OMP_NUM_THREADS=1 python -m scripts.packed.time_pack_lp [--device cuda] [--k 1 2 4 8] [--graph]

Each run: 64 logits of 2 classes (60 % positive), the capture-safe dense form the launcher trains
on CUDA (4,096 pairs, ``packed.graph.capture_form``), eps 0.01, float32. ``--graph`` (CUDA) also
times each variant captured in a CUDA graph and replayed. Prints one JSON line per (k, variant).
"""
from __future__ import annotations

import argparse
import json

import torch

from lpmetrics.objectives.auc import AUCLoss
from lpmetrics.objectives.common import labels_checked
from lpmetrics.packed.speed import interleaved_ms, warm_on_side_stream


def variants(k: int, device: torch.device) -> dict:
    objs = [AUCLoss(method="lp", epsilon=0.01).capture_safe_form().to(device) for _ in range(k)]
    g = torch.Generator().manual_seed(k)
    xs = [torch.randn(64, 2, generator=g).to(device).requires_grad_() for _ in range(k)]
    ys = [(torch.rand(64, generator=g) < 0.6).long().to(device) for _ in range(k)]

    def separate():
        torch.stack([o(x, y) for o, x, y in zip(objs, xs, ys)]).sum().backward()

    def batched():
        torch.stack(AUCLoss.pack_forward(objs, xs, ys)).sum().backward()
    return {"separate": separate, "batched": batched}


def graphed(fn, device):
    warm_on_side_stream(fn, device)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g.replay


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--k", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--graph", action="store_true")
    args = ap.parse_args()
    device = torch.device(args.device)
    with labels_checked():
        for k in args.k:
            fns = variants(k, device)
            if args.graph and device.type == "cuda":
                fns.update({f"{n}_graph": graphed(f, device) for n, f in list(fns.items())})
            ms = interleaved_ms(fns, args.reps, device, warmup=2)
            for name, v in ms.items():
                print(json.dumps({"k": k, "variant": name, "ms": round(v, 3), "ms_per_run": round(v / k, 3),
                                  "ratio_to_separate": round(v / ms[name.replace("batched", "separate")], 3),
                                  "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                                  "torch": torch.__version__}), flush=True)


if __name__ == "__main__":
    main()
