"""``python -m scripts.campaign submit``: the campaign's runs as submitit jobs, one job per pack (SLURM on a
cluster; submitit's local executor on one machine), each writing what a GPU window returns.

    python -m scripts.campaign submit --out <folder> --executor slurm --partition gpu --timeout-min 600
    python -m scripts.campaign submit --out <folder> --executor local --wait     # here; then:
    python -m scripts.campaign fold <folder>/*/

The wanted runs not done yet (:func:`queue_order.ordered_pending`), composable and runnable on a
device (``runs_on``; host-only entries are listed and left, as ``plan`` does), are cut into packs of
at most ``--max-pack`` runs of one dataset in queue order; each pack is one job that composes its
entries, checks each still composes to its queued protocol (a queue whose configs changed is
refused before anything is submitted, naming the entries), trains them with
:func:`packed.launch.train_packed` with no deadline (a cluster job has its own time limit, so there
is no one-command rule: a run of any length fits), and writes ``plan.json`` and ``runs.jsonl.gz``
under ``<out>/<pack id>/`` exactly as ``python -m scripts.campaign run`` does, so ``fold`` takes them unchanged.

A job that SLURM preempts is requeued by submitit (``checkpoint``) and trains its pack again from
step 0: a pack cannot resume (the packed launcher refuses ``resume=true``), so give each job a time
limit above its pack's training time. A failed job is reported with its log files.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

from scripts.campaign import gpu_tables
from scripts.campaign import queue as campaign_queue
from scripts.campaign.fold import outcome_text
from scripts.campaign.jobs import ROOT, composer
from scripts.tables import queue_order


def runnable(entries: list[dict]) -> tuple[list[dict], list[tuple[str, str]]]:
    """The entries a device job can train, and (key, why) of the others: not composing when the
    queue was made, or host-only (their loss needs the host every step)."""
    left = [(e["key"], f"does not compose: {e.get('error')}") for e in entries if e.get("config_sha") is None]
    left += [(e["key"], f"runs on the host, never in a device command: {e.get('runs_on_why') or 'host-only objective'}")
             for e in entries if e.get("config_sha") is not None and e.get("runs_on", "device") != "device"]
    good = [e for e in entries if e.get("config_sha") is not None and e.get("runs_on", "device") == "device"]
    return good, left


def packs_of(entries: list[dict], max_pack: int) -> list[list[dict]]:
    """Consecutive runs of one dataset, at most ``max_pack`` a pack, in queue order (the launcher
    splits a pack further where its runs cannot share one: another optimizer, batch, ...)."""
    out: list[list[dict]] = []
    for e in entries:
        if out and len(out[-1]) < max_pack and out[-1][0]["where"]["dataset.name"] == e["where"]["dataset.name"]:
            out[-1].append(e)
        else:
            out.append([e])
    return out


def device_overrides(args) -> list[str]:
    """The overrides every campaign run gets besides its entry's: evaluation interval, device, CSV
    logging, no checkpoints (nothing large comes back), and ``--set`` (ignorable keys only)."""
    return [f"trainer.eval_every={args.eval_every}", f"device={args.device}", "logger=csv",
            "trainer.checkpoints=false", *args.set]


def verifier(compose, extra: list[str]):
    """``verify(entry)``: None if the entry composes (with ``extra``) to its queued protocol."""
    def verify(e):
        try:
            cfg, _ = campaign_queue.compose_entry(compose, [*e["overrides"], *extra], e["experiment"])
            sha = campaign_queue.config_sha(campaign_queue.composed_config(cfg))
        except Exception as err:   # noqa: BLE001 -- reported with the key, the others go on
            return f"does not compose: {campaign_queue.first_line(err)}"
        return None if sha == e["config_sha"] else (
            "composes to another protocol than queued (configs changed since the queue was made: "
            "`python -m scripts.campaign queue --check` lists it; or an override in --set is not "
            "ignorable)")
    return verify


def check_composes(entries: list[dict], extra: list[str]) -> list[str]:
    """``key: why`` of each entry that no longer composes to its queued protocol."""
    with composer() as compose:
        verify = verifier(compose, extra)
        return [f"{e['key']}: {why}" for e in entries for why in [verify(e)] if why]


def jobs_of(entries: list[dict], extra: list[str], work: Path) -> tuple[list, dict]:
    """The packed launcher's jobs of ``entries`` (composed with ``extra``; run folders under
    ``work``) and their run folders by key (``python -m scripts.campaign run`` and the submitted jobs alike)."""
    from lpmetrics.packed.launch import Job
    jobs, run_dirs = [], {}
    with composer() as compose:
        for e in entries:
            cfg, choice = campaign_queue.compose_entry(compose, [*e["overrides"], *extra], e["experiment"])
            run_dirs[e["key"]] = work / e["key"]
            jobs.append(Job(cfg, run_dirs[e["key"]], {"objective": choice, "dataset": cfg.dataset.name}, e["key"]))
    return jobs, run_dirs


def train_and_export(jobs: list, run_dirs: dict, out: Path, queue_version: str, run_id: str,
                     deadline: float | None = None, max_pack: int | None = None, cuda_graph: bool = False,
                     mode: str = "auto", kind: str = "gpu", fused_update: bool | str = False) -> list:
    """Train the launcher's ``jobs`` as packs (:func:`packed.launch.train_packed`) and write their
    records to ``out/runs.jsonl.gz``, tagged with the queue version: what ``fold`` reads. Returns
    each job's outcome (its final step, or its exception)."""
    from lpmetrics.packed.launch import train_packed
    outcomes = train_packed(jobs, max_pack=max_pack, deadline=deadline, cuda_graph=cuda_graph, mode=mode,
                            fused_update=fused_update)
    gpu_tables.export(run_dirs, out, extra={"queue_version": queue_version, "run_id": run_id, "kind": kind})
    return outcomes


def pack_job(keys: list[str], queue_path: str, out: str, extra: list[str], cuda_graph: bool, run_id: str) -> dict:
    """The body of one submitted job: train the queue entries ``keys`` and write ``plan.json`` and
    ``runs.jsonl.gz`` under ``out`` (the job's own folder)."""
    queue = campaign_queue.read_json(Path(queue_path), "queue")
    entries = [e for e in queue["entries"] if e["key"] in set(keys)]
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    plan = {"run_id": run_id, "queue_version": queue["version"], "kept": [e["key"] for e in entries],
            "extra_overrides": extra, "kind": "submitit", "dataset": entries[0]["where"]["dataset.name"]}
    (out_dir / "plan.json").write_text(json.dumps(plan, indent=1))
    jobs, run_dirs = jobs_of(entries, extra, out_dir / "work")
    outcomes = train_and_export(jobs, run_dirs, out_dir, queue["version"], run_id, cuda_graph=cuda_graph,
                                kind="submitit")
    plan["outcome"] = {e["key"]: outcome_text(o, e["steps"]) for e, o in zip(entries, outcomes)}
    (out_dir / "plan.json").write_text(json.dumps(plan, indent=1))
    return plan["outcome"]


def executor_for(args, logs: Path):
    """A submitit executor: ``local`` (this machine, one process per job) or ``slurm``."""
    try:
        import submitit
    except ImportError as err:
        raise SystemExit("campaign submit needs submitit: pip install submitit (pinned in requirements.txt)") from err
    # a job unpickles pack_job by reference: its process must find this module (scripts.campaign.submit)
    # and the project (submitit's jobs inherit the environment, locally and through sbatch)
    paths = [str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    if args.executor == "local":
        ex = submitit.LocalExecutor(folder=str(logs))
        ex.update_parameters(timeout_min=args.timeout_min)
        return ex
    ex = submitit.AutoExecutor(folder=str(logs), cluster="slurm")
    ex.update_parameters(timeout_min=args.timeout_min, slurm_partition=args.partition, gpus_per_node=args.gpus,
                         cpus_per_task=args.cpus, nodes=1, tasks_per_node=1,
                         slurm_additional_parameters=dict(kv.split("=", 1) for kv in args.slurm))
    return ex


def submit(args, folder: Path) -> int:
    """Cut the wanted runs into packs, refuse a queue that no longer composes, submit one job per
    pack; with ``--wait``, wait and report each job (its log files where it failed)."""
    queue, ledger = campaign_queue.load(folder)
    todo, left = runnable(queue_order.ordered_pending(queue, ledger, folder))
    for key, why in left:
        print(f"submit: left {key}: {why}", flush=True)
    if args.dataset:
        todo = [e for e in todo if e["where"]["dataset.name"] == args.dataset]
    todo = todo[:args.limit] if args.limit else todo
    if not todo:
        print("submit: nothing wanted and runnable", flush=True)
        return 0
    extra = device_overrides(args)
    bad = check_composes(todo, extra)
    if bad:
        print("submit: refused, nothing submitted: these entries no longer compose to their queued protocol "
              "(`python -m scripts.campaign queue --check`):\n  " + "\n  ".join(bad), flush=True)
        return 1
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    executor = executor_for(args, out / "logs")
    submitted = []
    for i, pack in enumerate(packs_of(todo, args.max_pack)):
        run_id = f"{stamp}-p{i:03d}"
        job_out = out / run_id.replace(":", "-")
        job = executor.submit(pack_job, [e["key"] for e in pack], str((folder / campaign_queue.QUEUE_FILE).resolve()),
                              str(job_out), extra, args.cuda_graph, run_id)
        submitted.append((job, job_out, pack))
        print(f"submit: job {job.job_id}: {len(pack)} run(s) of {pack[0]['where']['dataset.name']} -> {job_out}",
              flush=True)
    if not args.wait:
        print(f"submit: {len(submitted)} job(s); when they end: python -m scripts.campaign fold {out}/*/", flush=True)
        return 0
    failed = 0
    for job, job_out, pack in submitted:
        try:
            outcome = job.result()
            print(f"submit: job {job.job_id} ended: " + ", ".join(f"{k}: {v}" for k, v in outcome.items()), flush=True)
        except Exception as err:   # noqa: BLE001 -- one failed job must not hide the others
            failed += 1
            print(f"submit: job {job.job_id} failed ({campaign_queue.first_line(err)}); its logs: "
                  f"{job.paths.stdout} and {job.paths.stderr}", flush=True)
    return 1 if failed == len(submitted) else 0


def add_parser(sub) -> None:
    s = sub.add_parser("submit", help="the wanted runs as submitit jobs, one per pack (SLURM or local)")
    s.add_argument("--out", required=True, help="one folder per job (plan.json, runs.jsonl.gz) and logs/")
    s.add_argument("--executor", choices=["local", "slurm"], default="slurm")
    s.add_argument("--max-pack", type=int, default=24, help="runs per job (one pack, one GPU)")
    s.add_argument("--timeout-min", type=int, default=720, help="each job's time limit")
    s.add_argument("--partition", default=None)
    s.add_argument("--gpus", type=int, default=1)
    s.add_argument("--cpus", type=int, default=8)
    s.add_argument("--slurm", nargs="*", default=[], metavar="KEY=VALUE", help="more sbatch parameters")
    s.add_argument("--dataset", help="only this dataset's runs")
    s.add_argument("--limit", type=int, default=0, help="at most this many runs (0: all)")
    s.add_argument("--eval-every", type=int, default=2000)
    s.add_argument("--device", default="auto")
    s.add_argument("--cuda-graph", action="store_true")
    s.add_argument("--wait", action="store_true", help="wait for the jobs and report them")
    s.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                   help="more overrides; only keys that do not define a protocol (make_tables.IGNORED)")
