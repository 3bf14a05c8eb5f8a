"""Median training-step time of several objectives, measured side by side in one run.

Each round runs one full step (forward, loss, backward, SGD step) of every objective in turn on
the same minibatch stream, so machine noise hits all of them alike; the ratios to `ce` are the
numbers to quote. Writes a Markdown table under results/step_time/.

    DATA_ROOT=../shared/data python -m scripts.solver.bench_step_time --dataset cifar10 \
        --objectives ce auc_lp f1_lp auc_ova_lp --batch-size 64 --steps 30
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

ROOT = Path(__file__).resolve().parents[2]

from lpmetrics.run.builders import build_model, instantiate_runtime, resolve_device, runtime_values
from lpmetrics.data import build_data
from lpmetrics.data.stream import BatchStream


def compose_cfg(overrides: list[str]):
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        return compose("config", overrides=overrides)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default="cifar10")
    ap.add_argument("--objectives", nargs="+", default=["ce", "auc_lp"])
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--steps", type=int, default=30, help="timed rounds (after warm-up)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--neg-keep", type=float, default=0.1)
    ap.add_argument("--task", default="binary")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--out", default=str(ROOT / "results" / "step_time"))
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                    help="extra config overrides, e.g. dataset.val_size=500")
    args = ap.parse_args()

    device = resolve_device(args.device)
    base = [f"dataset={args.dataset}", f"dataset.neg_keep={args.neg_keep}", f"dataset.task={args.task}"] + args.set
    # the data are built once, under the default objective: only dataset.* overrides matter there
    data_only = [o for o in base if o.lstrip("+~").startswith("dataset")]
    bundle = build_data(compose_cfg(data_only).dataset, seed=0)
    runs = {}
    for name in args.objectives:
        cfg = compose_cfg(base + [f"objective={name}"])
        torch.manual_seed(0)
        model = build_model(cfg, bundle).to(device).train()
        objective = instantiate_runtime(cfg.objective, **runtime_values(bundle)).to(device)
        params = [{"params": list(model.parameters())}] + objective.extra_param_groups()
        runs[name] = (model, objective, instantiate(cfg.optimizer, _partial_=True)(params=params), [])
    stream = BatchStream(bundle.to(device).train, args.batch_size, seed=0)
    for step in range(args.warmup + args.steps):
        x, y = (t.to(device) for t in next(stream))
        for name, (model, objective, optimizer, times) in runs.items():
            if device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            loss = objective(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            objective.on_step_end(step=step, model=model, optimizer=optimizer, batch=(x, y))
            if device.type == "cuda":
                torch.cuda.synchronize()
            if step >= args.warmup:
                times.append(1000 * (time.perf_counter() - t0))
    ref = statistics.median(runs["ce"][3]) if "ce" in runs else None
    lines = [f"Step time (forward+loss+backward+SGD), {args.dataset} {args.task}, ResNet-18, batch "
             f"{args.batch_size}, device {device}, torch threads {torch.get_num_threads()}, "
             f"{args.steps} rounds after {args.warmup} warm-up, interleaved.",
             "", "| objective | median ms | ratio to ce |", "|---|---:|---:|"]
    for name, (_, _, _, times) in runs.items():
        med = statistics.median(times)
        lines.append(f"| {name} | {med:.1f} | {med / ref:.3f} |" if ref else f"| {name} | {med:.1f} | - |")
    cmd = "python -m scripts.solver.bench_step_time " + " ".join(sys.argv[1:])
    lines += ["", f"Command: `{cmd}`"]
    text = "\n".join(lines)
    print(text)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.dataset}_{args.task}_b{args.batch_size}_{device.type}.md").write_text(text + "\n")


if __name__ == "__main__":
    main()
