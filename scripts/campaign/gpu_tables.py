"""One dataset's Table-1 block (Meng et al. 2021, Table 1) inside one GPU slot, planned from measured speed.

    python -m scripts.campaign.gpu_tables run --dataset cifar10 --out OUT [--budget-s 480] [--steps 40000]
    python -m scripts.campaign.gpu_tables unpack OUT/runs.jsonl.gz --into results/gpu_tables/cifar10

``run`` (what ``scripts/campaign/gpu_tables.sh`` calls on the lent machine):

1. **Jobs.** The block is 4 imbalance levels (91/83/71/50 % positives) x ``ce``, ``auc_lp``,
   ``ppd_sg``, ``ppd_adagrad`` x the lr grid x seeds, composed from ``experiment=table1_binary``
   exactly as ``train.py -m experiment=table1_binary dataset=D`` composes its jobs, ordered
   seed-major (every cell of seed 0 at every lr, then seed 1, ...) and kept in whole seeds:
   whatever is dropped, the block's cells and the lr selection stay complete for the seeds that ran.
2. **Plan.** Before training, it times a packed training step of the real model on the real batch
   shape for each objective with its own optimizer (:mod:`packed.speed`) and one evaluation, then keeps the longest prefix of the job list, in whole
   seeds, whose projected time fits ``--budget-s`` (with a 20 % margin). If not even seed 0's
   block (every lr, level and objective) fits at ``--steps``, it shortens the runs to the longest
   length at which it does (two significant digits). It prints and records (``plan.json``) what it kept, what it dropped and why.
3. **Train.** :func:`packed.launch.train_packed` with ``deadline`` = start + budget: a pack that
   would overrun stops at its deadline and says so in each run's ``results.json``.
4. **Export** (the device tool brings back at most 8 files): ``runs.jsonl.gz`` (per run: its name,
   ``results.json`` and ``metrics.csv``; never checkpoints), ``tables.md``
   (``scripts/tables/make_tables.py --table binary``, per-cell and global lr rules), ``plan.json``.

``unpack`` turns ``runs.jsonl.gz`` back into the usual run-folder layout (``<name>/results.json``,
``<name>/metrics.csv``), which ``make_tables.py`` and ``summarize_runs.py`` read.
"""
from __future__ import annotations

import argparse
import contextlib
import gzip
import io
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

from scripts.campaign.jobs import compose_job, jobs  # shared with scripts/campaign/cli.py
from scripts.tables import make_tables

LEVELS = (0.1, 0.2, 0.4, 1.0)            # dataset.neg_keep: 91 / 83 / 71 / 50 % positives
OBJECTIVES = ("ce", "auc_lp", "ppd_sg", "ppd_adagrad")
LRS = (0.1, 0.01, 0.001)
SEEDS = (0, 1, 2)
MARGIN = 0.8                              # plan for 80 % of the budget: packs, evals and setup vary


def job_specs(dataset: str, seeds, lrs, levels=LEVELS, objectives=OBJECTIVES) -> list[dict]:
    """The block's jobs, seed-major: ``{"name", "overrides", "values"}``."""
    return jobs({"seed": list(seeds), "optimizer.lr": list(lrs), "dataset.neg_keep": list(levels),
                 "objective": list(objectives)}, fixed={"dataset": dataset})


def measure(cfg, overrides: list[str], device, pack_n: int, reps: int,
            objectives=OBJECTIVES, experiment: str = "table1_binary", cuda_graph: bool = False,
            mode: str = "auto") -> dict:
    """ms per run-step of a packed step (each of ``objectives``) at ``pack_n`` runs, and ms of one
    evaluation of that pack (``eval_ms_pack``: every run's val and test, test in both BatchNorm
    modes, through the pack's forward: :func:`packed.speed.pack_eval_ms`) and its share per run
    (``eval_ms``), for the model and batch of ``cfg``. The step timed is the one
    :func:`packed.launch.train_packed` would take (``cuda_graph`` as passed to it): the objectives
    in the form a pack on ``device`` trains (:func:`packed.graph.capture_form`), sync-free on
    CUDA, and, where a graph is asked and the pack can be captured, the graph's replay
    (``graph_<objective>`` in the result says which was timed); the pack's forward in ``mode``
    (:data:`packed.model.MODES`, as ``train_packed(mode=)``; ``mode`` in the result)."""
    from hydra.utils import instantiate

    from lpmetrics.run.builders import build_model, instantiate_runtime, runtime_values
    from lpmetrics.data import build_data
    from lpmetrics.packed.graph import GraphedStep, capture_form
    from lpmetrics.packed.launch import step_runner
    from lpmetrics.packed.model import MODES
    from lpmetrics.packed.speed import EvalRow, build_runs, pack_eval_ms, runner_ms
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}; got {mode!r}")
    bundle = build_data(cfg.dataset, seed=cfg.seed).to(device)
    runtime = runtime_values(bundle)
    shape, batch = tuple(bundle.input_shape), int(cfg.trainer.batch_size)
    out = {"pack_n": pack_n, "input_shape": list(shape), "batch_size": batch, "mode": mode}
    for name in objectives:   # each with the optimizer its config brings (ppd_*: their own)
        job = compose_job([*overrides, f"objective={name}"], experiment)   # the last objective= wins
        runs = build_runs(lambda: build_model(cfg, bundle), shape, batch, pack_n, device,
                          make_objective=lambda: instantiate_runtime(job.objective, **runtime),
                          num_classes=bundle.num_classes,
                          make_optimizer=lambda groups: instantiate(job.optimizer, _partial_=True)(params=groups),
                          sync_free=device.type == "cuda",   # as train_packed steps there
                          pack_form=lambda o: capture_form(o, device), mode=mode)
        runner = step_runner(runs.stepper, cuda_graph, device, pack_n)
        out[f"step_ms_per_run_{name}"] = runner_ms(runs, runner, reps, device) / pack_n
        out[f"graph_{name}"] = isinstance(runner, GraphedStep)
    # the last objective's pack, after its timed steps: an evaluation does not depend on the loss
    out["eval_ms_pack"] = pack_eval_ms(runs.stepper.packed, [EvalRow(cfg, bundle)] * pack_n, device)
    out["eval_ms"] = out["eval_ms_pack"] / pack_n
    return out


def run_cost_s(objective: str, speed: dict, n_steps: int, eval_every: int) -> float:
    """Projected seconds of one run of ``objective``: its steps at the probed rate, its evaluations."""
    return (n_steps * speed[f"step_ms_per_run_{objective}"]
            + math.ceil(n_steps / eval_every) * speed["eval_ms"]) / 1000


def whole_blocks(blocks: list[list], cost_of, avail: float) -> tuple[list, float]:
    """The longest prefix of ``blocks`` (lists of jobs) whose ``cost_of(jobs)`` (seconds for a set
    of jobs: packs share work, so not always a sum) fits ``avail``: (its jobs, their cost). Whole
    blocks only: a table's cells stay complete for the seeds kept."""
    kept, total = [], 0.0
    for group in blocks:
        c = cost_of(kept + group)
        if c > avail:
            break
        kept, total = kept + group, c
    return kept, total


def plan(specs: list[dict], speed: dict, budget_s: float, steps: int, eval_every: int,
         block: int) -> dict:
    """The longest prefix of ``specs`` in whole blocks of ``block`` jobs (one seed: every lr,
    level and objective) that fits ``MARGIN * budget_s``; if not even the first block fits at
    ``steps``, the longest run length (two significant digits) at which it does, with evaluations
    at most every ``eval_every`` steps and at the end."""
    def cost_s(spec, n_steps):
        return run_cost_s(objective_of(spec), speed, n_steps, eval_every)
    avail = MARGIN * budget_s
    first = specs[:block]
    reason = None
    if sum(cost_s(s, steps) for s in first) > avail:
        lo, hi = 0, steps   # largest n with cost(n) <= avail (cost grows with n)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if sum(cost_s(s, mid) for s in first) <= avail else (lo, mid - 1)
        digits = 10 ** max(0, len(str(lo)) - 2)
        steps, reason = max(1, lo // digits * digits), f"the first {len(first)} runs do not fit at {steps} steps"
    kept, total = whole_blocks([specs[i:i + block] for i in range(0, len(specs), block)],
                               lambda jobs: sum(cost_s(spec, steps) for spec in jobs), avail)
    return {"steps": steps, "eval_every": min(eval_every, steps), "shortened_because": reason,
            "kept": [s["name"] for s in kept], "dropped": [s["name"] for s in specs[len(kept):]],
            "projected_s": round(total, 1), "budget_s": budget_s}


def export(run_dirs: dict[str, Path], out: Path, extra: dict | None = None) -> Path:
    """``runs.jsonl.gz``: one line per run folder that has a ``metrics.csv`` (plus ``extra``'s keys)."""
    path = out / "runs.jsonl.gz"
    with gzip.open(path, "wt") as f:
        for name, d in run_dirs.items():
            if not (d / "metrics.csv").is_file():
                continue
            res = json.loads((d / "results.json").read_text()) if (d / "results.json").is_file() else None
            f.write(json.dumps({"name": name, "results": res, "metrics_csv": (d / "metrics.csv").read_text(),
                                **(extra or {})}) + "\n")
    return path


def unpack(path: Path, into: Path) -> list[Path]:
    """Recreate ``<into>/<name>/{results.json, metrics.csv}`` from ``runs.jsonl.gz``."""
    made = []
    with gzip.open(path, "rt") as f:
        for line in f:
            rec = json.loads(line)
            d = into / rec["name"]
            d.mkdir(parents=True, exist_ok=True)
            (d / "metrics.csv").write_text(rec["metrics_csv"])
            if rec["results"] is not None:
                (d / "results.json").write_text(json.dumps(rec["results"], indent=2))
            made.append(d)
    return made


def tables(runs: Path, out: Path) -> None:
    """``tables.md``: the binary table under both lr rules (make_tables.py's stderr kept)."""
    parts = []
    for rule in ("per-cell", "global"):
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            try:
                text = make_tables.main([str(runs), "--table", "binary", "--lr-rule", rule])
            except SystemExit as e:
                text = f"(make_tables exited with {e.code})"
        notes = err.getvalue().replace(f"{runs}{os.sep}", "").replace(str(runs), "<runs>")  # portable
        parts.append(f"## lr rule: {rule}\n\n{text}\n\n{notes}")
    (out / "tables.md").write_text("\n".join(parts))


def run(args) -> int:
    import torch
    from lpmetrics.run.builders import resolve_device
    from lpmetrics.packed.launch import Job, train_packed
    start = time.monotonic()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(args.work or tempfile.mkdtemp(prefix="gpu_tables_"))   # run folders stay out of OUT
    specs = job_specs(args.dataset, args.seeds, args.lrs, objectives=args.objectives)
    # no checkpoints: none travels back, and on the H100 slot writing best.pt + last.pt took
    # ~4 s per run and evaluation (results/gpu_tables/cifar10_h100/)
    extra = [f"trainer.max_steps={args.steps}", f"trainer.eval_every={args.eval_every}",
             f"device={args.device}", "logger=csv", "trainer.checkpoints=false", *args.set]
    first_cfg = compose_job(specs[0]["overrides"] + extra)
    device = resolve_device(first_cfg.device)
    speed = measure(first_cfg, specs[0]["overrides"] + extra, device, min(args.probe_n, len(specs)),
                    args.probe_reps, args.objectives)
    block = len(args.lrs) * len(LEVELS) * len(args.objectives)
    elapsed = time.monotonic() - start
    the_plan = plan(specs, speed, args.budget_s - elapsed, args.steps, args.eval_every, block)
    the_plan.update(speed=speed, device=str(device), torch=torch.__version__, setup_s=round(elapsed, 1),
                    extra_overrides=extra)
    print(f"plan: {len(the_plan['kept'])} of {len(specs)} runs at {the_plan['steps']} steps, "
          f"projected {the_plan['projected_s']} s of {the_plan['budget_s']:.0f} s; dropped "
          f"{len(the_plan['dropped'])}" + (f"; shortened: {the_plan['shortened_because']}"
                                            if the_plan["shortened_because"] else ""), flush=True)
    (out / "plan.json").write_text(json.dumps(the_plan, indent=2))
    steps_override = [f"trainer.max_steps={the_plan['steps']}", f"trainer.eval_every={the_plan['eval_every']}"]
    jobs, run_dirs = [], {}
    for spec in specs:
        if spec["name"] not in the_plan["kept"]:
            continue
        cfg = compose_job(spec["overrides"] + extra + steps_override)
        run_dirs[spec["name"]] = work / spec["name"]
        jobs.append(Job(cfg, run_dirs[spec["name"]], {"objective": objective_of(spec), "dataset": args.dataset},
                        spec["name"]))
    # the deadline leaves time for every run's last evaluation and the export
    reserve_s = 1.5 * len(jobs) * speed["eval_ms"] / 1000 + 10
    outcomes = train_packed(jobs, max_pack=args.max_pack, deadline=start + args.budget_s - reserve_s)
    failed = [j.name for j, o in zip(jobs, outcomes) if isinstance(o, Exception)]
    export(run_dirs, out)
    tables(work, out)
    print(f"done: {len(jobs) - len(failed)} runs written, {len(failed)} not run"
          f"{': ' + ', '.join(failed) if failed else ''}; {time.monotonic() - start:.0f} s", flush=True)
    return 1 if jobs and len(failed) == len(jobs) else 0


def objective_of(spec: dict) -> str:
    return next(o.split("=", 1)[1] for o in spec["overrides"] if o.startswith("objective="))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="plan, train and export one dataset's Table-1 block")
    r.add_argument("--dataset", required=True, help="cifar10 or catdog (one data pack per GPU call)")
    r.add_argument("--out", required=True)
    r.add_argument("--work", help="run folders (default: a temporary folder; only "
                   "OUT's exported files travel back)")
    r.add_argument("--budget-s", type=float, default=480.0, help="wall seconds for everything")
    r.add_argument("--steps", type=int, default=40000, help="run length if it fits (the paper's)")
    r.add_argument("--eval-every", type=int, default=10000)
    r.add_argument("--lrs", type=float, nargs="+", default=list(LRS))
    r.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    r.add_argument("--objectives", nargs="+", default=list(OBJECTIVES),
                   help="objective configs (e.g. auc_lp_capture for auc_lp: the same loss, no host sync)")
    r.add_argument("--device", default="auto")
    r.add_argument("--max-pack", type=int, default=None)
    r.add_argument("--probe-n", type=int, default=24,
                   help="pack size of the speed probe (~ the ce + auc_lp pack of one seed's block)")
    r.add_argument("--probe-reps", type=int, default=3)
    r.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="extra overrides")
    u = sub.add_parser("unpack", help="runs.jsonl.gz -> run folders")
    u.add_argument("path", type=Path)
    u.add_argument("--into", type=Path, required=True)
    args = ap.parse_args(argv)
    if args.cmd == "unpack":
        print(f"{len(unpack(args.path, args.into))} run folders under {args.into}")
        return 0
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
