"""Does a real CUDA graph of each Table-1 objective's pack step equal the eager step?

    python -m lpmetrics.packed.check_graph --device cuda --out "$OUT/check_graph.json"    # a GPU window
    OMP_NUM_THREADS=1 python -m lpmetrics.packed.check_graph --device cpu --steps 4     # the script itself

The float64 CPU tests (``tests/test_packed_capture.py``) stand in for the graph; this is the check
only a GPU can make. For ``ce``, ``auc_lp``, ``ppd_sg`` and ``ppd_adagrad`` (each with its own
optimizer from the configs; SGD runs with an lr milestone, PPD runs with ``T0=3`` so a stage ends
inside the run) it trains one pack three times from the same weights on the same batches:

- ``graph``: :class:`packed.graph.GraphedStep` with a real CUDA graph, the launcher's choices on
  CUDA (``auc_lp`` in its capture-safe form, the pack-wide SGD update);
- ``eager``: the same stepper eagerly (sync-free): should equal ``graph`` up to kernel
  non-determinism (cuDNN is set deterministic);
- ``configured``: eagerly with per-run optimizers and the configured objective form: equal in
  float64 (the CPU tests), in float32 apart by rounding, and for ``auc_lp`` by a whole pair's
  gradient where a margin lies within rounding of a ramp kink (0 or eps: the two LP sizes can
  decide it differently), after which the trajectories drift apart (CPU, MLP, 6 steps: loss
  1.7e-2, parameters 1.0e-2; ``ce`` / PPD: 0.0).

It writes, per objective, the largest loss and parameter differences, the captures and the steps
run eagerly, and ms per step of each mode. On the CPU a stand-in that calls the step replaces the
graph (the script's own check, not the GPU's).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from lpmetrics.run.builders import instantiate_runtime
from lpmetrics.models.mlp import MLP
from lpmetrics.models.resnet import resnet18
from lpmetrics.objectives.common import labels_checked
from lpmetrics.packed.graph import CudaGraph, GraphedStep, capture_form
from lpmetrics.packed.model import pack
from lpmetrics.packed.optim import unsupported
from lpmetrics.packed.step import PackedStep, param_groups

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
OBJECTIVES = {"ce": ["scheduler.milestones=[3]"], "auc_lp": ["scheduler.milestones=[3]"],
              "ppd_sg": ["optimizer.T0=3"], "ppd_adagrad": ["optimizer.T0=3"]}


class Calls:
    """The CPU's stand-in for a CUDA graph: each replay calls the step."""

    def __init__(self, fn, device):
        self.fn, self.output = fn, None

    def replay(self):
        self.output = self.fn()


def build(name: str, model: str, n: int, device: torch.device, launcher_choices: bool):
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = compose("config", overrides=[f"objective={name}", *OBJECTIVES[name]])
    torch.manual_seed(0)
    shape = [3, 32, 32] if model == "resnet18" else [3, 8, 8]
    nets = [(resnet18(2, shape) if model == "resnet18" else MLP(2, shape, hidden=[64])).to(device)
            for _ in range(n)]
    packed = pack(nets)
    runtime = dict(num_classes=2, input_shape=shape, pos_ratio=0.6, class_counts=[40, 60])
    objectives = [instantiate_runtime(cfg.objective, **runtime).to(device) for _ in range(n)]
    if launcher_choices:   # what the launcher picks on CUDA (also on the CPU, to check the script)
        objectives = [capture_form(o, "cuda") for o in objectives]
    opts = [instantiate(cfg.optimizer, _partial_=True)(params=param_groups(m, o))
            for m, o in zip(packed.models, objectives)]
    scheds = [torch.optim.lr_scheduler.MultiStepLR(o, list(cfg.scheduler.milestones), gamma=0.1) for o in opts]
    packed.train()
    stepper = PackedStep(packed, objectives, opts, scheds, sync_free=True,
                         pack_update=launcher_choices and not unsupported(packed, opts))
    return packed, stepper, shape


def train(stepper, batches, graph: bool, device: torch.device):
    """Losses per step and ms per step of the pack trained on ``batches``."""
    runner = GraphedStep(stepper, warmup=1, make_graph=CudaGraph if device.type == "cuda" else Calls) \
        if graph else stepper
    losses, t0 = [], time.perf_counter()
    with labels_checked():
        for t, (x, y) in enumerate(batches):
            losses.append(runner.step(x, y, t).losses)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    ms = 1000 * (time.perf_counter() - t0) / len(batches)
    return torch.stack(losses), ms, runner


def check(name: str, model: str, n: int, steps: int, device: torch.device) -> dict:
    runs = {mode: build(name, model, n, device, launcher_choices=mode != "configured")
            for mode in ("graph", "eager", "configured")}
    shape = runs["graph"][2]
    g = torch.Generator().manual_seed(1)
    batches = []
    for _ in range(steps):
        y = (torch.rand(n, 64, generator=g) < 0.6).long()
        batches.append((torch.randn(n, 64, *shape, generator=g).to(device), y.to(device)))
    out = {}
    for mode, (packed, stepper, _) in runs.items():
        losses, ms, runner = train(stepper, batches, graph=mode == "graph", device=device)
        out[mode] = dict(losses=losses, ms=ms, packed=packed, runner=runner, stepper=stepper)
    row = {"objective": name, "n": n, "steps": steps, "pack_update": out["graph"]["stepper"].update is not None,
           "captures": out["graph"]["runner"].captures, "host_steps": out["graph"]["runner"].host_steps,
           **{f"ms_{mode}": round(v["ms"], 3) for mode, v in out.items()}}
    for other in ("eager", "configured"):
        row[f"loss_diff_vs_{other}"] = float((out["graph"]["losses"] - out[other]["losses"]).abs().max())
        row[f"param_diff_vs_{other}"] = max(float((a - out[other]["packed"].params[k]).detach().abs().max())
                                            for k, a in out["graph"]["packed"].params.items())
    return row


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--model", default="resnet18", choices=["resnet18", "mlp"])
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--objectives", nargs="+", default=list(OBJECTIVES))
    ap.add_argument("--out", default=None, help="write the rows as JSON here")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    rows = []
    for name in args.objectives:
        try:
            rows.append(check(name, args.model, args.n, args.steps, device))
        except Exception as err:   # noqa: BLE001 -- the failure is the answer for this objective
            rows.append({"objective": name, "error": f"{type(err).__name__}: {str(err)[:300]}"})
        print(json.dumps(rows[-1]), flush=True)
        if args.out:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps(rows, indent=1) + "\n")
    return rows


if __name__ == "__main__":
    main()
