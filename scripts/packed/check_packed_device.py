"""Packing checks that only a GPU can answer, as one JSON report.

    python -m scripts.packed.check_packed_device --device cuda --out OUT/check_packed_cuda.json

The CPU tests (``tests/test_packed*.py``, float64) prove the packed step exact; on a GPU the
kernels differ (cuDNN grouped convolutions, TF32), so this script measures, on ResNet-18 at
32 px, batch 64, ``ce`` + SGD, float32, with cuDNN in deterministic mode:

1. **NaN isolation**: a pack of 3 where run 1's first convolution holds a NaN against the same
   pack without it, 3 sync-free steps: runs 0 and 2 must stay bit-identical (a grouped kernel
   that mixed groups, e.g. by multiplying zeros with NaN, would show here), and run 1 must be
   reported diverged at step 1.
2. **Sync-free = eager**: the same pack stepped 3 times in each mode; the max absolute
   difference of every parameter (0 expected: the same kernels in the same order).
3. **Packed = separate**: one step of each run alone (``torch.nn`` model, same init and batch)
   against its packed twin; max absolute difference of logits and parameters (grouped vs plain
   convolutions sum in another order, so small differences are expected; they are the number).
4. **CUDA graph**: captures the sync-free ``ce`` step (labels checked once) and replays it
   3 times against 3 eager sync-free steps from the same state; max parameter difference. The
   same for the binary AUC LP with ``pair_layout="dense"`` and ``solver.capture_safe``; then
   :class:`packed.graph.GraphedStep` (warm-up, capture, an lr milestone that forces a recapture)
   against 8 eager steps.

Runs on the CPU too (``--device cpu``; no graph there), which is how it is tested.
"""
from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]

from lpmetrics.models.resnet import resnet18
from lpmetrics.objectives.auc import AUCLoss
from lpmetrics.objectives.ce import CrossEntropy
from lpmetrics.objectives.common import labels_checked
from lpmetrics.packed import PackedStep, pack, param_groups

SGD = dict(lr=0.1, momentum=0.9, weight_decay=5e-4)


def make_models(n: int, px: int, device) -> list[torch.nn.Module]:
    torch.manual_seed(0)
    return [resnet18(2, [3, px, px]).to(device) for _ in range(n)]


def dense_auc():
    """The binary AUC LP in its capture-safe form: fixed-shape pairs, fixed Newton counts."""
    return AUCLoss(epsilon=0.1, pair_layout="dense", solver={"capture_safe": True})


def stepper_for(models, sync_free: bool, make_objective=CrossEntropy) -> PackedStep:
    packed = pack([copy.deepcopy(m) for m in models])
    objectives = [make_objective() for _ in models]
    opts = [torch.optim.SGD(param_groups(m, o), **SGD) for m, o in zip(packed.models, objectives)]
    packed.train()
    return PackedStep(packed, objectives, opts, [None] * len(models), sync_free=sync_free)


def batches(n: int, px: int, batch: int, steps: int, device):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(n, batch, 3, px, px, generator=g).to(device),
             torch.randint(0, 2, (n, batch), generator=g).to(device)) for _ in range(steps)]


def max_diff(a: PackedStep, b: PackedStep, runs) -> float:
    return max(float((a.packed.params[k][i] - b.packed.params[k][i]).detach().abs().max())
               for k in a.packed.params for i in runs)


def bitwise(a: PackedStep, b: PackedStep, i: int) -> bool:
    return all(torch.equal(a.packed.params[k][i], b.packed.params[k][i]) for k in a.packed.params) and \
        all(torch.equal(a.packed.buffers[k][i], b.packed.buffers[k][i]) for k in a.packed.buffers)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--px", type=int, default=32)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    t0 = time.perf_counter()
    report: dict = {"device": str(device), "torch": torch.__version__,
                    "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
                    "config": vars(args) | {"out": None}}
    models = make_models(3, args.px, device)
    data = batches(3, args.px, args.batch, args.steps, device)

    healthy, sick = stepper_for(models, True), stepper_for(models, True)
    with torch.no_grad():
        sick.packed.params["conv1.weight"][1, 0, 0, 0, 0] = float("nan")
    with labels_checked():
        for t, (x, y) in enumerate(data):
            healthy.step(x, y, t), sick.step(x, y, t)
    sick.poll()
    report["nan_isolation"] = {
        "others_bit_identical": all(bitwise(healthy, sick, i) for i in (0, 2)),
        "diverged": {str(i): vars(d) for i, d in sick.divergences.items()}}

    eager = stepper_for(models, False)
    for t, (x, y) in enumerate(data):
        eager.step(x, y, t)
    report["sync_free_vs_eager_max_abs_param_diff"] = max_diff(healthy, eager, range(3))

    packed = stepper_for(models, False)
    alone = [copy.deepcopy(m).train() for m in models]
    opts = [torch.optim.SGD(m.parameters(), **SGD) for m in alone]
    x, y = data[0]
    out = packed.step(x, y, 0)
    logit_diff = 0.0
    for i, (m, opt) in enumerate(zip(alone, opts)):
        logits = m(x[i])
        loss = torch.nn.functional.cross_entropy(logits, y[i])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        logit_diff = max(logit_diff, float((out.logits[i] - logits.detach()).abs().max()))
    param_diff = max(float((packed.packed.params[k][i] - p).detach().abs().max())
                     for i, m in enumerate(alone) for k, p in m.named_parameters())
    report["packed_vs_separate_one_step"] = {"max_abs_logit_diff": logit_diff,
                                             "max_abs_param_diff": param_diff}

    if device.type == "cuda":
        report["cuda_graph"] = graph_check(models, data, device)
        report["cuda_graph_auc_lp_dense"] = graph_check(models, data, device, dense_auc)
        report["graphed_step_vs_eager"] = graphed_step_check(models, device)
    report["wall_s"] = round(time.perf_counter() - t0, 1)
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 0


def graph_check(models, data, device, make_objective=CrossEntropy) -> dict:
    """Capture one sync-free step on static tensors; replay it against eager sync-free steps."""
    ref, cap = stepper_for(models, True, make_objective), stepper_for(models, True, make_objective)
    x_static, y_static = data[0][0].clone(), data[0][1].clone()
    with labels_checked():
        for st in (ref, cap):   # the first step builds the optimizer state and device flags
            st.step(x_static, y_static, 0)
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            cap.step(x_static, y_static, 1)
        torch.cuda.current_stream(device).wait_stream(side)
        ref.step(x_static, y_static, 1)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                cap.step(x_static, y_static, 2)
        except Exception as exc:  # noqa: BLE001 -- the failure is the finding
            return {"status": f"capture failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}
        for t in range(2, 2 + len(data)):
            x, y = data[(t - 2) % len(data)]
            x_static.copy_(x), y_static.copy_(y)
            graph.replay()
            ref.step(x, y, t)
    torch.cuda.synchronize(device)
    return {"status": "captured", "replays": len(data),
            "max_abs_param_diff_vs_eager": max_diff(ref, cap, range(len(models)))}


def graphed_step_check(models, device, steps: int = 8) -> dict:
    """:class:`packed.graph.GraphedStep` (the launcher's ``cuda_graph=True``) against eager
    sync-free steps: runs of ``ce`` and the dense capture-safe AUC LP, an lr milestone at step 4."""
    from lpmetrics.packed.graph import GraphedStep
    objectives = [CrossEntropy, dense_auc, CrossEntropy]

    def build():
        packed = pack([copy.deepcopy(m) for m in models])
        objs = [make() for make in objectives]
        opts = [torch.optim.SGD(param_groups(m, o), **SGD) for m, o in zip(packed.models, objs)]
        scheds = [torch.optim.lr_scheduler.MultiStepLR(o, [4], gamma=1 / 3) for o in opts]
        packed.train()
        return PackedStep(packed, objs, opts, scheds, sync_free=True)

    eager, graphed = build(), None
    try:
        graphed = GraphedStep(build())
        data = batches(len(models), 32, 64, steps, device)
        with labels_checked():
            for t, (x, y) in enumerate(data):
                a, b = eager.step(x, y, t), graphed.step(x, y, t)
        torch.cuda.synchronize(device)
    except Exception as exc:  # noqa: BLE001 -- the failure is the finding
        return {"status": f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}
    return {"status": "ok", "steps": steps, "captures": graphed.captures,
            "max_abs_param_diff": max_diff(eager, graphed.stepper, range(len(models))),
            "max_abs_last_loss_diff": float((a.losses - b.losses).abs().max())}


if __name__ == "__main__":
    sys.exit(main())
