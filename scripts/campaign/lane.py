"""``python -m scripts.campaign cpu``: the campaign's CPU lane, run in the background of any machine
without a GPU (``make lane``).

    python -m scripts.campaign cpu start [--background]   # train the next entries, one per core
    python -m scripts.campaign cpu status                 # per run: step, metric so far, s/step, ETA
    python -m scripts.campaign cpu fold                   # fold what finished (start does it too)
    python -m scripts.campaign cpu stop                   # stop the lane and its trainings

Why. A GPU window trains a pack of runs inside one 10-minute command; a CPU trains one run for
hours (a paper-regime run: ~4.4 h on one core of this project's Xeon with the stock convolutions),
longer than a session keeps its machine. So the lane trains each queue entry as a plain
``train.py`` run in a folder outside the repository (``--lane-dir``, default ``~/lpmetrics_lane``),
checkpointing at every evaluation (``trainer.eval_every``, 1,000 steps), and every start first
resumes the unfinished runs the machine still holds. A run killed at any step (SIGTERM, SIGKILL,
a machine taken away) loses at most the steps since its last checkpoint; nothing is folded
before the run has written its 40k-step ``results.json``.

Order (:func:`lane_order`). First the runs the lane has started (a run folder, no
``results.json``): they resume before anything new, so a start never leaves hours of training
behind. Then the studies in :data:`STUDIES` (below), then the queue (:func:`cpu_order`): the
cells in :data:`CELLS`, each cell's seed 0 first, objectives and
lrs in :data:`FIRST` (the order that makes the comparison informative earliest: with two cores,
each pair of runs is a CE and an LP run at the lrs where each trained best in shorter studies;
the LP at lr 0.1 stayed at chance through 4k steps in this regime), then the cell's seeds 1-2 at
the lr seed 0 chose (the queue's ``chosen`` rule: pending only once every seed-0 lr of the cell is
folded), then the next cell. ``--all`` continues with the rest of the queue in its own order.

Rules. One lane per machine (``lane.lock``; a second start reports what runs and starts
nothing); one training per queue entry (``runs/<key>/.lock``, held by the training process
itself, so a lane that dies leaves its trainings locked until they end). Every training runs
the committed code of the commit the lane started from (a ``git worktree`` under ``code/``), so
edits in the checkout never reach a running training. Before a run starts its entry must still
compose, from that snapshot's configs, to its queued protocol (else it is refused with its key). Speed options that define no
protocol are pinned per run so a run keeps one path to its end: a new run gets the convolution
path ``auto`` chooses here (:func:`conv_override`) and the compiled optimizer step
(:func:`optimizer_override`), a resumed one what its config names. A run folder whose
``lane.json`` names another protocol than its entry's is neither resumed nor folded. A stop
asks each training for a checkpoint first (``SIGUSR1``, :func:`request_checkpoints`;
``lpmetrics/run/request.py``) and ends it once written, so a stop loses no steps; ``cpu
checkpoint`` asks for one and lets them go on (before a session ends: a machine given back keeps
every step). A finished
run is folded into ``results/paper_tables/`` by :func:`scripts.campaign.fold.fold_cpu` (its
``results.json`` protocol hash equal to the entry's), with the launch commits and the fold commit
in its ``campaign.json``; committing the fold is the session's job.

Studies (:data:`STUDIES`). A question the tables depend on (does bf16 change what a run learns?)
is answered by runs of this CPU, which the lane occupies, so the lane trains a study's runs as a
stage: after the runs it has started, before any queue entry it has not. A study is a run list
(``NAME|QUEUE KEY|CHANGES``, :func:`read_study`): each run is that queue entry's experiment and
overrides with the changes applied, so no protocol is written twice. Its runs use the same locks,
resume, code snapshot, convolution path, ``nice`` and one training per core as the queue's, live
in ``<lane dir>/studies/<study>/<run>/`` (key ``<study>/<run>``), show in ``cpu status``, and are
never folded: a study's report reads them (``python -m scripts.cpu.precision_report``). A run
whose report is committed (``results/<study>/runs/<run>/results.json``, :func:`answered`) is
answered: no lane trains it again, on this machine or a new one whose lane folder is empty (delete
the committed copy to have it trained afresh).
``cpu start --no-studies`` leaves the stage out, started study runs included: they wait, and resume
at the next start without it. A study run's protocol is what its line composes to now: a folder
whose ``lane.json`` records another (the line was edited after it began; :func:`protocol_held`,
the one comparison the lane and the report make) is neither resumed nor, once finished, counted
as finished: it is refused with both hashes until its folder is deleted (the lane then trains it
afresh) or the line restored.

``--set KEY=VALUE``: an override every training gets, for keys that define no protocol (paths,
logging, ``model.conv_impl``). A study run keeps what its line sets: a ``--set`` of a key its line
changes is left out of that run's command (logged; :func:`study_extra`), so a study's twins stay
on the convolution path they pin whatever ``--set`` asks of the queue's runs.
"""
from __future__ import annotations

import csv
import fcntl
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from lpmetrics.run import request
from scripts.campaign import fold as campaign_fold
from scripts.campaign import queue as campaign_queue
from scripts.campaign import submit as campaign_submit
from scripts.campaign.jobs import ROOT, composer
from scripts.tables import make_tables, queue_order

#: the cells the lane trains, in order: (dataset, dataset.neg_keep) of Table 1 in the paper's regime
CELLS = (("cifar10", 0.1), ("catdog", 0.1))
#: objective and lr of a cell's seed-0 runs, in the order the lane takes them
FIRST = (("ce", 0.1), ("auc_lp", 0.01), ("ce", 0.01), ("auc_lp", 0.001), ("auc_lp", 0.1), ("ce", 0.001),
         ("ppd_sg", 0.1), ("ppd_sg", 0.01), ("ppd_sg", 0.001),
         ("ppd_adagrad", 0.1), ("ppd_adagrad", 0.01), ("ppd_adagrad", 0.001))
STAGES = ("table1_seed0", "table1_seeds12")
LANE_NOTE = "CPU lane: its queue entry trained by train.py on a CPU (scripts/campaign/lane.py)"
DEFAULT_LANE_DIR = Path(os.environ.get("LPMETRICS_LANE", Path.home() / "lpmetrics_lane"))
POLL_S = 30.0
#: how long a stop or ``cpu checkpoint`` waits for the trainings' requested checkpoints (a step, or
#: an evaluation in progress, ~20 s on the CPU, ends first; then ``last.pt`` is written)
REQUEST_WAIT_S = 120.0
MAX_FAILURES = 2   # a run that exits non-zero this often without progress is left for a person
NICE = 19         # the trainings yield the CPU to the session's own work (tests, benchmarks)
GPU_RECIPE = "docs/reproducing.md (the window on a lent GPU: scripts/campaign/gpu_window.sh)"
#: the lane's studies, trained after the runs it has started and before any queue entry it has not:
#: (name, run list). cpu_precision: fp32 vs bf16 twins (results/cpu_precision/README.md)
STUDIES = (("cpu_precision", ROOT / "scripts" / "studies" / "cpu_precision_runs.txt"),)
#: where a study's report commits its finished runs: ``<REPORTS>/<study>/runs/<run>/results.json``
REPORTS = ROOT / "results"


class LaneError(RuntimeError):
    """The lane cannot start or go on; the message says why and what to do."""


# ----------------------------------------------------------------------------- order


def lane_rank(entry: dict) -> tuple | None:
    """Sort key of a queue entry in the lane's order, or ``None`` if the lane does not take it."""
    where = entry.get("where", {})
    cell = (where.get("dataset.name"), where.get("dataset.neg_keep"))
    if cell not in CELLS or entry.get("stage") not in STAGES or entry.get("experiment") != "table1_binary":
        return None
    pair = (entry.get("objective"), entry.get("lr"))
    first = FIRST.index(pair) if pair in FIRST else len(FIRST)
    return CELLS.index(cell), STAGES.index(entry["stage"]), entry.get("seed", 0), first


def cpu_order(queue: dict, ledger: dict, folder: Path, everything: bool = False) -> list[dict]:
    """The wanted, pending, composable entries in the lane's order (``everything``: then the rest
    of the queue in its own order)."""
    pending, _ = campaign_submit.runnable(queue_order.ordered_pending(queue, ledger, folder))
    mine = sorted((e for e in pending if lane_rank(e) is not None), key=lane_rank)
    return mine + ([e for e in pending if lane_rank(e) is None] if everything else [])


def lane_order(queue: dict, ledger: dict, folder: Path, lane_dir: Path, everything: bool = False,
               studies=()) -> list[dict]:
    """What the lane trains, in order: the runs it has started (queue entries and the runs of
    ``studies`` with a run folder and no ``results.json``, whatever ``everything`` says: hours of
    training are never left behind; a study left out, ``--no-studies``, waits whole), then the unfinished runs of ``studies`` in their lists' order, then
    :func:`cpu_order`. A study run whose report is committed (:func:`answered`) is left out."""
    full = cpu_order(queue, ledger, folder, everything=True)
    wanted = full if everything else [e for e in full if lane_rank(e) is not None]
    study = [e for name, path in studies for e in study_entries(name, path, queue) if not answered(e)]

    def started(e: dict) -> bool:
        run = LaneRun.of(lane_dir, e["key"])
        return run.folder.is_dir() and run.results() is None
    first = [e for e in [*full, *study] if started(e)]
    rest = [e for e in study if not started(e) and LaneRun.of(lane_dir, e["key"]).results() is None]
    return first + rest + [e for e in wanted if not started(e)]


# ----------------------------------------------------------------------------- studies


def answered(entry: dict) -> bool:
    """Whether study run ``entry``'s report is committed (its ``results.json`` under
    :data:`REPORTS`): the lane then leaves it out, started or not."""
    study, _, run = entry["key"].rpartition("/")
    return bool(study) and (REPORTS / study / "runs" / run / "results.json").is_file()


def read_study(path: Path) -> list[tuple[str, str, list[str]]]:
    """``(run, queue key, changes)`` per line of a study's run list (``NAME|QUEUE KEY|CHANGES``;
    ``#`` comments)."""
    out = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = [p.strip() for p in line.split("|")]
        if len(parts) != 3 or not all(parts[:2]):
            raise LaneError(f"{path}:{n}: a run is NAME|QUEUE KEY|CHANGES, got {line!r}")
        out.append((parts[0], parts[1], parts[2].split()))
    return out


def changed(overrides: list[str], changes: list[str]) -> list[str]:
    """``overrides`` with each ``key=value`` of ``changes`` in place of the override of its key,
    or added after them: the entry's own overrides stay as the queue has them, in its order."""
    out = list(overrides)
    for change in changes:
        key = change.split("=", 1)[0]
        at = next((i for i, o in enumerate(out) if o.split("=", 1)[0] == key), None)
        if at is None:
            out.append(change)
        else:
            out[at] = change
    return out


def override_value(overrides: list[str], key: str) -> str | None:
    """The value ``overrides`` give ``key`` (the last one), or ``None``."""
    values = [o.split("=", 1)[1] for o in overrides if o.split("=", 1)[0] == key]
    return values[-1] if values else None


def study_entries(name: str, path: Path, queue: dict) -> list[dict]:
    """The runs of study ``name`` as lane entries (key ``<name>/<run>``); a run whose queue entry
    the queue lacks carries an ``error`` (refused with it, the others go on). Its ``changes`` are its
    line's (kept over ``--set``: :func:`study_extra`); its ``config_sha`` is what its overrides
    compose to, set when the lane checks it (:meth:`Lane.check_entry`)."""
    entries = {e["key"]: e for e in queue["entries"]}
    out = []
    for run, base_key, changes in read_study(path):
        entry = {"key": f"{name}/{run}", "study": name, "base": base_key}
        base = entries.get(base_key)
        if base is None:
            out.append({**entry, "steps": None,
                        "error": f"its queue entry {base_key} is not in queue {queue['version']} (see {path})"})
            continue
        overrides = changed(base["overrides"], changes)
        steps = override_value(overrides, "trainer.max_steps")
        out.append({**entry, "experiment": base["experiment"], "overrides": overrides, "changes": changes,
                    "steps": int(steps) if steps is not None else base["steps"]})
    return out


def study_extra(entry: dict, extra: list[str]) -> tuple[list[str], list[str]]:
    """(the ``--set`` overrides ``entry``'s training gets, those left out): a study run keeps each
    key its line changes (its twins' pinned ``model.conv_impl``, say), so a ``--set`` of such a key
    is left out of its command, whatever Hydra prefix it carries (``+``, ``++``, ``~``); a queue
    entry gets them all."""
    def key(override: str) -> str:
        return override.split("=", 1)[0].lstrip("+~")
    pinned = {key(c) for c in entry.get("changes", [])}
    kept = [s for s in extra if key(s) not in pinned]
    return kept, [s for s in extra if s not in kept]


def protocol_held(entry: dict, run: "LaneRun", compose) -> tuple[str | None, str | None]:
    """The one check of a run folder against its entry, for the lane and a study's report:
    ``(why, held)``, why the entry cannot run now (a study line that no longer composes; ``held`` is
    then ``None``) and the other protocol ``run``'s folder records (:func:`foreign_protocol`). A
    study run's ``config_sha`` is first set from its line as it composes now (:func:`study_protocol`)."""
    if entry.get("study"):
        why = study_protocol(entry, compose)
        if why:
            return why, None
    return None, foreign_protocol(run, entry["config_sha"])


def foreign_protocol(run: LaneRun, sha: str) -> str | None:
    """The protocol hash ``run``'s folder records if it is not ``sha``, else ``None`` (the same, or
    nothing recorded: no run begun). The record is the ``config_sha`` the lane writes into
    ``lane.json`` when it starts the run, the hash of what its entry (a study run: its line)
    composed to then (:func:`scripts.campaign.queue.config_sha`)."""
    held = run.info.get("config_sha")
    return None if held in (None, sha) else held


# ----------------------------------------------------------------------------- run folders


def run_folder(lane_dir: Path, key: str) -> Path:
    """A queue entry's run folder, ``runs/<key>/``; a study run's (key ``<study>/<run>``: queue keys
    have no ``/``), ``studies/<study>/<run>/``, where :func:`fold_finished` never looks."""
    study, _, run = key.rpartition("/")
    return lane_dir / "studies" / study / run if study else lane_dir / "runs" / key


@dataclass
class LaneRun:
    """One entry's run folder (:func:`run_folder`) and its ``lane.json``."""
    folder: Path
    info: dict = field(default_factory=dict)

    @classmethod
    def of(cls, lane_dir: Path, key: str) -> "LaneRun":
        folder = run_folder(lane_dir, key)
        path = folder / "lane.json"
        return cls(folder, json.loads(path.read_text()) if path.is_file() else {})

    def save(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        campaign_queue.write_json(self.folder / "lane.json", self.info)

    @property
    def lock_path(self) -> Path:
        return self.folder / ".lock"

    def locked(self) -> bool:
        """Whether a training holds this run (its ``.lock``)."""
        if not self.lock_path.is_file():
            return False
        with open(self.lock_path) as fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(fh, fcntl.LOCK_UN)
        return False

    def has_checkpoint(self) -> bool:
        return (self.folder / "last.pt").is_file() or (self.folder / "last.prev.pt").is_file()

    def results(self) -> dict | None:
        path = self.folder / "results.json"
        try:
            return json.loads(path.read_text()) if path.is_file() else None
        except ValueError:
            return None

    def rows(self) -> list[dict]:
        path = self.folder / "metrics.csv"
        if not path.is_file():
            return []
        with open(path, newline="") as fh:
            return list(csv.DictReader(fh))

    def progress(self) -> tuple[int | None, float | None]:
        """(step, s/step) from the training's progress bar (``train.log``), else (None, None).
        s/step is the mean since the segment began (the bar's elapsed time over the steps since the
        step it resumed from, ``lane.json``), evaluations and any pause included, so an ETA holds
        over the run; the bar's own rate, a moving average that a pause or an evaluation inflates
        for a while, only where the segment's start is unknown."""
        tail = log_tail(self.folder, 8192)
        if tail is None:
            return None, None
        found = re.findall(r"(\d+)/(\d+) \[([\d:]+)<[^\]]*?(\d+(?:\.\d+)?)(s/it|it/s)", tail)
        if not found:
            return None, None
        step, _, elapsed, rate, unit = found[-1]
        step, segments = int(step), self.info.get("segments") or [{}]
        since = segments[-1].get("resumed_from_step")
        if since is not None and step > since:
            seconds = sum(int(part) * 60 ** i for i, part in enumerate(reversed(elapsed.split(":"))))
            return step, seconds / (step - since)
        rate = float(rate)
        return step, (rate if unit == "s/it" else (1.0 / rate if rate else None))


# ----------------------------------------------------------------------------- code and commands


def git(*args: str, cwd: Path = ROOT) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def code_snapshot(lane_dir: Path, commit: str) -> Path:
    """A detached ``git worktree`` of ``commit`` under ``<lane dir>/code/``: what the trainings run."""
    where = lane_dir / "code" / commit[:12]
    if (where / "train.py").is_file():
        try:
            if git("rev-parse", "HEAD", cwd=where) == commit:
                return where
        except subprocess.CalledProcessError:
            pass   # a worktree of a checkout that is gone: make it again
        subprocess.run(["rm", "-rf", str(where)], check=True)
    git("worktree", "prune")
    where.parent.mkdir(parents=True, exist_ok=True)
    git("worktree", "add", "--detach", str(where), commit)
    return where


def data_root() -> str | None:
    if os.environ.get("DATA_ROOT"):
        return os.environ["DATA_ROOT"]
    shared = ROOT.parent / "shared" / "data"
    return str(shared) if shared.is_dir() else None


def train_command(entry: dict, code: Path, run: LaneRun, resume: bool, extra: list[str]) -> list[str]:
    """``nice python <code>/train.py experiment=... <entry overrides> ...`` for one run."""
    return ["nice", "-n", str(NICE), sys.executable, str(code / "train.py"), f"experiment={entry['experiment']}",
            *entry["overrides"], "logger=csv", f"hydra.run.dir={run.folder}", *extra,
            *(["resume=true"] if resume else [])]


def conv_override(entry: dict, code: Path, run: LaneRun, resume: bool, extra: list[str], log=print) -> list[str]:
    """``model.conv_impl=<path>`` that keeps a run on one convolution path to its end, or nothing
    (the code has no such key, or ``--set`` names it). A resumed run keeps the path its config
    names (none: it began before the key existed, on torchvision's modules: ``stock``); a new run
    gets the path ``auto`` chooses on this machine (:mod:`scripts.campaign.conv_choice`, run in
    the code snapshot; recorded in ``lane.json``), passed explicitly so no later machine's
    ``auto`` can move it. The key is no part of a protocol (``make_tables.IGNORED``). A run whose
    own overrides pin the path (a study's twins) keeps those."""
    if any(s.startswith("model.conv_impl=") for s in [*entry.get("overrides", []), *extra]) or \
            "conv_impl" not in (code / "configs" / "model" / "resnet18.yaml").read_text():
        return []
    if resume:
        from omegaconf import OmegaConf
        saved = run.folder / ".hydra" / "config.yaml"
        model = OmegaConf.select(OmegaConf.load(saved), "model") if saved.is_file() else None
        if model is None or ("conv_impl" not in model and "resnet" not in str(model.get("_target_"))):
            return []   # a model without convolutions (model=mlp), or no config to read
        return [f"model.conv_impl={model.get('conv_impl') or 'stock'}"]
    cmd = [sys.executable, "-m", "scripts.campaign.conv_choice", f"experiment={entry['experiment']}",
           *entry["overrides"], *extra]
    proc = subprocess.run(["nice", "-n", str(NICE), *cmd], cwd=code, env=train_env(), capture_output=True, text=True)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("CONV ")), None)
    record = json.loads(line[5:]) if line else None
    if line and record is None:
        return []   # the run's model has no convolution path to choose (model=mlp)
    if record is None:
        log(f"lane: {entry['key']}: the convolution path could not be chosen ahead "
            f"({(proc.stderr or '').strip()[-300:]}); the run's own config decides")
        return []
    run.info["conv"] = record
    return [f"model.conv_impl={record['impl']}"]


def optimizer_override(entry: dict, code: Path, run: LaneRun, resume: bool, extra: list[str],
                       log=print) -> list[str]:
    """``trainer.optimizer_impl=<form>`` that keeps a run on one optimizer step to its end, or
    nothing (the code has no such key, or a new run's line or ``--set`` names it). A new run gets
    ``compiled`` (:mod:`lpmetrics.run.optimizer_step`: the step's elementwise passes fused by
    ``torch.compile``; a lane run is hours long, its compiles take seconds); a resumed run keeps
    the form its config names (none: it began before the key existed, eagerly), over a ``--set``
    that asks another (logged; ``train_command`` puts this after the sets, and Hydra applies a
    key's last override), since a resume that changed it would be refused. Like the convolution
    path, no part of a protocol (``make_tables.IGNORED``)."""
    if "optimizer_impl" not in (code / "configs" / "config.yaml").read_text():
        return []
    named = [s.split("=", 1)[1] for s in [*entry.get("overrides", []), *extra]
             if s.startswith("trainer.optimizer_impl=")]
    if not resume:
        return [] if named else ["trainer.optimizer_impl=compiled"]
    from omegaconf import OmegaConf
    saved = run.folder / ".hydra" / "config.yaml"
    form = (OmegaConf.select(OmegaConf.load(saved), "trainer.optimizer_impl") if saved.is_file() else None) or "eager"
    if named and named[-1] != form:
        log(f"lane: {entry['key']}: keeps trainer.optimizer_impl={form}, the form it began with, over "
            f"trainer.optimizer_impl={named[-1]} (a resume may not change it)")
    return [f"trainer.optimizer_impl={form}"]


#: glibc malloc settings for the trainings: serve every allocation from the heap and never give it
#: back, so a step's large temporaries (im2col patches, full-size gradients of the dropped taps)
#: reuse pages instead of mapping fresh ones that fault on first touch (fp32 32 px GEMM step,
#: lane paused, 2026-11-28: 2,696 minor faults per step by default, 156 with these; 246.0 -> 219.3
#: ms, 0.89x; an earlier run with a 1 GB mmap threshold: 0.95x. ``python -m scripts.cpu.bench_levers
#: malloc --pause-lane --rounds 30``). Memory is not returned to the system until the training exits.
#: Both are needed: the trim threshold alone disables glibc's adaptive mmap threshold and leaves
#: every allocation above 128 KB mapped afresh (~76,000 faults per step). 32 MB is the largest
#: mmap threshold glibc documents on 64-bit systems; a training step's largest temporary, the
#: stem's im2col at 32 px, is 9.6 MB.
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(1 << 25), "MALLOC_TRIM_THRESHOLD_": str(1 << 32)}


def train_env() -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "WANDB_MODE": "disabled",
           "PYTHONUNBUFFERED": "1", **MALLOC_ENV}
    env.pop("PYTHONPATH", None)   # the snapshot's own package, not the checkout's
    root = data_root()
    if root:
        env["DATA_ROOT"] = root
    return env


# ----------------------------------------------------------------------------- the lane


class Lane:
    """The supervisor: keeps ``jobs`` trainings running, folds what finishes."""

    def __init__(self, lane_dir: Path, campaign_dir: Path, jobs: int, everything: bool = False,
                 extra: list[str] | None = None, log=print, studies=None):
        self.dir, self.campaign_dir, self.jobs, self.everything = lane_dir, campaign_dir, jobs, everything
        self.extra = list(extra or [])
        self.studies = STUDIES if studies is None else tuple(studies)   # () = --no-studies
        self._finished_checked: dict[tuple, str | None] = {}             # refuse_foreign_finished
        self.log = log
        self.children: dict[str, subprocess.Popen] = {}
        self.refused: dict[str, str] = {}
        self.stopping = False

    # -- one pass
    def candidates(self) -> list[dict]:
        queue, ledger = campaign_queue.load(self.campaign_dir)
        self.queue = queue
        return lane_order(queue, ledger, self.campaign_dir, self.dir, self.everything, self.studies)

    def check_entry(self, entry: dict, compose) -> str | None:
        """Why ``entry`` cannot be trained here now, or ``None``. A study run's protocol is what its
        overrides compose to now (set as its ``config_sha``: a folder begun under other overrides
        is refused like a queue entry's)."""
        run = LaneRun.of(self.dir, entry["key"])
        why, held = protocol_held(entry, run, compose)
        if why:
            return why
        if held:
            return (f"its run folder {run.folder} holds protocol {held}, the entry is "
                    f"{entry['config_sha']}: neither resumed nor folded (move the folder away to train it afresh)")
        if run.info.get("failures", 0) >= MAX_FAILURES:
            return f"failed {run.info['failures']} times without progress (see {run.folder / 'train.log'})"
        return None if entry.get("study") else campaign_submit.verifier(compose, [])(entry)

    def start_run(self, entry: dict, code: Path, commit: str) -> None:
        run = LaneRun.of(self.dir, entry["key"])
        resume = run.has_checkpoint()
        # the step the training resumes from (for cpu status' s/step only): its checkpoint's, written
        # just after the last metrics row at every evaluation, or later where a checkpoint was asked
        # for (request_checkpoints; its step in train.log); the bar's last step only where neither
        # is known (further on, it made a resumed segment's s/step ~10x too long). One interval off
        # where a checkpoint write was cut short or the training falls back to last.prev.pt
        rows = run.rows() if resume else []
        step = int(float(rows[-1]["step"])) if rows and rows[-1].get("step") else None
        asked = requested_step(run.folder) if resume else None
        if asked is not None and (step is None or asked > step):
            step = asked
        elif step is None and resume:
            step = run.progress()[0]
        run.info.update(key=entry["key"], config_sha=entry["config_sha"], queue_version=self.queue["version"],
                        steps=entry["steps"], **({"study": entry["study"], "base": entry["base"]}
                                                 if entry.get("study") else {}))
        run.folder.mkdir(parents=True, exist_ok=True)
        lock = open(run.lock_path, "a+")
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        sets, left_out = study_extra(entry, self.extra)
        if left_out:
            self.log(f"lane: {entry['key']}: left out --set {' '.join(left_out)}: its study line sets "
                     "that key (a study run keeps its line's values)")
        extra = [*sets, *conv_override(entry, code, run, resume, sets, self.log),
                 *optimizer_override(entry, code, run, resume, sets, self.log)]
        run.info.setdefault("segments", []).append(
            {"commit": commit, "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
             "resumed_from_step": step if resume else 0, "overrides": extra})
        run.save()
        cmd = train_command(entry, code, run, resume, extra)
        with open(run.folder / "train.log", "ab") as out:
            out.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(cmd)}\n".encode())
            out.flush()
            # the child holds the lock too (pass_fds): it stays held while the training lives
            child = subprocess.Popen(cmd, cwd=code, env=train_env(), stdout=out, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, pass_fds=(lock.fileno(),), start_new_session=True)
        lock.close()
        self.children[entry["key"]] = child
        self.log(f"lane: started {entry['key']} ({'resumed' if resume else 'new'}; pid {child.pid})")

    def reap(self) -> None:
        for key, child in list(self.children.items()):
            code = child.poll()
            if code is None:
                continue
            del self.children[key]
            run = LaneRun.of(self.dir, key)
            res = run.results()
            finished = res is not None and (res.get("final") or {}).get("step") == run.info.get("steps")
            if code == 0 or finished or (res or {}).get("diverged"):
                run.info["failures"] = 0
                self.log(f"lane: {key} ended (exit {code})")
            else:
                step, _ = run.progress()
                last = run.info.get("last_failure_step")
                run.info["failures"] = run.info.get("failures", 0) + 1 if step == last else 1
                run.info["last_failure_step"] = step
                self.log(f"lane: {key} failed (exit {code}) at step {step}; see {run.folder / 'train.log'}")
            run.save()

    def fill(self, code: Path, commit: str) -> None:
        free = self.jobs - len(self.children)
        if free <= 0 or self.stopping:
            return
        # the snapshot's configs, not the checkout's: an entry is checked against the code that
        # would train it, so a config key committed while the lane runs refuses nothing (its
        # trainings, and these checks, see it from the next start on)
        with composer(code / "configs") as compose:
            for entry in self.candidates():
                if free <= 0:
                    break
                key = entry["key"]
                run = LaneRun.of(self.dir, key)
                if key in self.children or run.locked() or run.results() is not None:
                    continue
                why = self.check_entry(entry, compose)
                if why:
                    self.refuse(key, why)
                    continue
                self.start_run(entry, code, commit)
                free -= 1
            self.refuse_foreign_finished(compose)

    def refuse(self, key: str, why: str) -> None:
        if self.refused.get(key) != why:
            self.log(f"lane: refused {key}: {why}")
        self.refused[key] = why

    def refuse_foreign_finished(self, compose) -> None:
        """Refuse each finished study run whose folder holds another protocol than its line composes
        to now (:func:`protocol_held`): not counted as finished, and never trained over. The refusal
        is written into its ``lane.json`` (``refused``) for ``cpu status``, and taken out again once
        the line composes to the folder's protocol."""
        for name, path in self.studies:
            for entry in study_entries(name, path, self.queue):
                run = LaneRun.of(self.dir, entry["key"])
                if run.results() is None or not run.info.get("config_sha"):
                    continue   # unfinished (the loop above checks it) or no record to compare
                # composing takes ~0.5 s: once per (line, recorded protocol), not at every poll
                seen = (entry["key"], tuple(entry["overrides"]), run.info["config_sha"])
                if seen not in self._finished_checked:
                    why, held = protocol_held(entry, run, compose)
                    if held:
                        why = (f"finished under protocol {held}, its line in {path.name} composes to "
                               f"{entry['config_sha']} now: not counted as finished; delete {run.folder} so "
                               "the lane trains it afresh, or restore the line")
                    self._finished_checked[seen] = why
                why = self._finished_checked[seen]
                if why:
                    self.refuse(entry["key"], why)
                if run.info.get("refused") != why:
                    if why:
                        run.info["refused"] = why
                    else:
                        run.info.pop("refused", None)
                    run.save()

    def supervise(self, commit: str, once: bool = False) -> int:
        code = code_snapshot(self.dir, commit)
        self.log(f"lane: code {commit[:12]} at {code}; {self.jobs} training(s) at a time")
        while True:
            self.reap()
            fold_finished(self.dir, self.campaign_dir, self.log)
            self.fill(code, commit)
            if not self.children:
                self.log("lane: nothing left to train in the lane's cells" +
                         (f" ({len(self.refused)} refused: see above)" if self.refused else ""))
                return 0
            if once:
                return 0
            time.sleep(POLL_S)

    def terminate(self, *_):
        self.stopping = True
        folders = {key: LaneRun.of(self.dir, key).folder for key in self.children}
        request_checkpoints([f for key, f in folders.items() if request.listening_pid(f) == self.children[key].pid],
                            self.log)
        for key, child in self.children.items():
            self.log(f"lane: stopping {key} (pid {child.pid}); it resumes from its last checkpoint")
            try:
                os.killpg(child.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for child in self.children.values():
            try:
                child.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, signal.SIGKILL)
        raise SystemExit(0)


def request_checkpoints(folders: list[Path], log=print, timeout: float = REQUEST_WAIT_S) -> list[Path]:
    """Ask the training in each of ``folders`` for a checkpoint now (``SIGUSR1``, sent only to a
    process that answers it: :func:`lpmetrics.run.request.listening_pid`) and wait until each has
    written ``last.pt`` or ``timeout`` has passed; the folders whose checkpoint was written."""
    asked, logged = {}, {}
    for folder in folders:
        pid = request.listening_pid(folder)
        if pid is None:
            log(f"lane: {folder.name}: no training there answers checkpoint requests; its last checkpoint stands")
            continue
        asked[folder], logged[folder] = _mtime(folder / "last.pt"), requested_step(folder)
        try:
            os.kill(pid, signal.SIGUSR1)
        except ProcessLookupError:
            del asked[folder]
    written, deadline = [], time.monotonic() + timeout
    while asked and time.monotonic() < deadline:
        time.sleep(0.25)
        for folder, before in list(asked.items()):
            if _mtime(folder / "last.pt") not in (None, before):
                written.append(folder)
                del asked[folder]
    for folder in written:   # the training logs the step just after the file lands (an evaluation's: never)
        step, until = requested_step(folder), time.monotonic() + 2.0
        while step == logged[folder] and time.monotonic() < until:
            time.sleep(0.1)
            step = requested_step(folder)
        log(f"lane: {folder.name}: checkpoint written" + (f" at step {step}" if step != logged[folder] else ""))
    for folder in asked:
        log(f"lane: {folder.name}: no checkpoint within {timeout:.0f} s; its last checkpoint stands")
    return written


def _mtime(path: Path) -> int | None:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return None


def requested_step(folder: Path) -> int | None:
    """The step of the last checkpoint a request wrote in ``folder`` (its ``train.log``: the
    training says ``checkpoint at step N (requested: SIGUSR1)``), or ``None``."""
    found = re.findall(r"checkpoint at step (\d+) \(requested", log_tail(folder, 65536) or "")
    return int(found[-1]) if found else None


def log_tail(folder: Path, size: int) -> str | None:
    """The last ``size`` bytes of ``folder``'s ``train.log`` as text, or ``None`` if it has none."""
    log = folder / "train.log"
    if not log.is_file():
        return None
    with open(log, "rb") as fh:
        fh.seek(max(0, log.stat().st_size - size))
        return fh.read().decode(errors="replace")


def study_protocol(entry: dict, compose) -> str | None:
    """Set a study run's ``config_sha`` (its overrides, composed as :func:`train_command` runs them
    without ``--set``, like a queue entry's); or why it cannot run."""
    if entry.get("error"):
        return entry["error"]
    try:
        cfg, _ = campaign_queue.compose_entry(compose, entry["overrides"], entry["experiment"])
    except Exception as err:   # noqa: BLE001 -- reported with the key, the others go on
        return f"does not compose: {campaign_queue.first_line(err)}"
    entry["config_sha"] = campaign_queue.config_sha(campaign_queue.composed_config(cfg))
    return None


def fold_finished(lane_dir: Path, campaign_dir: Path, log=print) -> list[str]:
    """Fold every finished, unlocked lane run whose protocol is its entry's; the keys folded."""
    queue, ledger = campaign_queue.load(campaign_dir)
    entries = {e["key"]: e for e in queue["entries"]}
    commit = git("rev-parse", "HEAD")
    folded = []
    for folder in sorted((lane_dir / "runs").glob("*/")):
        run = LaneRun.of(lane_dir, folder.name)
        key, res = folder.name, run.results()
        if res is None or run.locked() or run.info.get("folded") or key in ledger.get("runs", {}):
            continue
        entry = entries.get(key)
        if entry is None or campaign_queue.config_sha(res["config"]) != entry["config_sha"]:
            why = "no such entry" if entry is None else "its protocol differs from its entry's"
            if run.info.get("not_folded") != why:
                log(f"lane: not folding {key}: {why} (queue {queue['version']})")
                run.info["not_folded"] = why
                run.save()
            continue
        meta = {"lane": {"launch_commits": sorted({s["commit"] for s in run.info.get("segments", [])}),
                         "fold_commit": commit, "segments": run.info.get("segments", [])}}
        counts = campaign_fold.fold_cpu([folder], campaign_dir, LANE_NOTE, log=log, entry_only=True, meta=meta)
        if counts.get("done") or counts.get("diverged"):
            run.info["folded"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            run.save()
            folded.append(key)
    return folded


# ----------------------------------------------------------------------------- status


def folder_keys(lane_dir: Path) -> list[str]:
    """The keys of every run folder ``lane_dir`` holds: queue entries, then study runs (:func:`run_folder`)."""
    return [*sorted(p.name for p in (lane_dir / "runs").glob("*/")),
            *sorted(f"{p.parent.name}/{p.name}" for p in (lane_dir / "studies").glob("*/*/"))]


def status_lines(lane_dir: Path, campaign_dir: Path, studies=None) -> list[str]:
    """Per run the lane holds or will train (in its order): state, step, val AUC, s/step, ETA, its
    convolution path (:func:`conv_path`) and optimizer step (:func:`optimizer_form`)."""
    queue, ledger = campaign_queue.load(campaign_dir)
    order = lane_order(queue, ledger, campaign_dir, lane_dir, studies=STUDIES if studies is None else studies)
    keys = [e["key"] for e in order]
    seen = folder_keys(lane_dir)
    lines = [f"lane {lane_dir}: {lane_holder(lane_dir) or 'not running'}"]
    lines.append(f"{'run':38} {'state':9} {'step':>11} {'val_auc':>8} {'best':>6} {'s/step':>6} {'ETA':>7}  "
                 f"{'conv':10} optimizer")
    for key in dict.fromkeys([*seen, *keys]):
        run = LaneRun.of(lane_dir, key)
        res, rows = run.results(), run.rows()
        steps = run.info.get("steps") or next((e["steps"] for e in order if e["key"] == key), None) or 40000
        step, rate = run.progress()
        done_at = ledger.get("runs", {}).get(key, {}).get("status")
        state = ("folded" if run.info.get("folded") or done_at else "refused" if run.info.get("refused")
                 else "finished" if res is not None
                 else "training" if run.locked() else "stopped" if run.folder.is_dir() else "queued")
        step = (res or {}).get("final", {}).get("step") if res else step
        if step is None and rows:
            step = int(rows[-1]["step"])
        vals = [float(r["val_auc"]) for r in rows if r.get("val_auc") not in (None, "")]
        eta = "" if state != "training" or not rate or step is None else f"{(steps - step) * rate / 3600:.1f}h"
        lines.append(f"{key:38} {state:9} {(f'{step}/{steps}' if step is not None else '-'):>11} "
                     f"{(f'{vals[-1]:.4f}' if vals else '-'):>8} {(f'{max(vals):.4f}' if vals else '-'):>6} "
                     f"{(f'{rate:.2f}' if rate else '-'):>6} {eta:>7}  {conv_path(run.info, res):10} "
                     f"{optimizer_form(run.info, res)}")
    return lines


def conv_path(info: dict, results: dict | None) -> str:
    """The convolution path a run trains with (``model.conv_impl``, with ``-bf16`` for
    ``trainer.precision=bf16``): from its ``results.json`` once finished, else the
    ``model.conv_impl`` its latest segment was started with; ``-`` where neither says (not yet
    started, or a study run whose line pins the path)."""
    if results:
        cfg = make_tables.flatten(results.get("config") or {})
        impl, recorded = make_tables.step_record(results, cfg)
        if impl:
            return impl + ("-bf16" if (recorded or cfg.get("trainer.precision")) == "bf16" else "")
    return latest_override(info, "model.conv_impl") or "-"


def latest_override(info: dict, key: str) -> str | None:
    """The value ``key=...`` had in the overrides the run's latest segment was started with."""
    overrides = ((info.get("segments") or [{}])[-1]).get("overrides") or []
    return next((o.split("=", 1)[1] for o in overrides if o.startswith(f"{key}=")), None)


def optimizer_form(info: dict, results: dict | None) -> str:
    """The optimizer step a run trains with (``trainer.optimizer_impl``, eager or compiled): what
    its ``results.json`` records as run once finished, else what its latest segment was started
    with; ``-`` where neither says (not yet started, or begun before the key: eager)."""
    record = (results or {}).get("optimizer_impl")
    if isinstance(record, dict) and record.get("impl"):
        return record["impl"]
    return latest_override(info, "trainer.optimizer_impl") or "-"


def held_keys(lane_dir: Path, campaign_dir: Path) -> list[str]:
    """The queue keys the lane has begun and not folded (training, stopped, or finished and not yet
    folded), one run folder each: what a GPU window must leave out (``gpu_window.sh``'s ``EXCLUDE``)
    so that no entry trains in two places. Study runs are no queue entries and are not listed."""
    _, ledger = campaign_queue.load(campaign_dir)
    done = ledger.get("runs", {})
    return [p.name for p in sorted((lane_dir / "runs").glob("*/"))
            if p.name not in done and not LaneRun.of(lane_dir, p.name).info.get("folded")]


def lane_holder(lane_dir: Path) -> str | None:
    """``pid N since T`` of the running lane, or ``None``."""
    path = lane_dir / "lane.lock"
    if not path.is_file():
        return None
    with open(path) as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return f"running ({fh.read().strip()})"
        fcntl.flock(fh, fcntl.LOCK_UN)
    return None


# ----------------------------------------------------------------------------- commands


def gpu_present() -> bool:
    import torch
    return torch.cuda.is_available()


def background_argv(args, lane_dir: Path) -> list[str]:
    """The ``cpu start`` command line the detached lane runs: this one's options, without
    ``--background``."""
    return [sys.executable, "-m", "scripts.campaign", "--dir", args.dir, "cpu", "start",
            "--lane-dir", str(lane_dir), "--jobs", str(args.jobs), *(["--all"] if args.all else []),
            *(["--force"] if args.force else []), *(["--no-studies"] if args.no_studies else []),
            *sum((["--set", s] for s in args.set), [])]


def start(args) -> int:
    lane_dir = Path(args.lane_dir).expanduser()
    lane_dir.mkdir(parents=True, exist_ok=True)
    if gpu_present() and not args.force:
        raise LaneError(f"this machine has a GPU: train the queue with the GPU window instead ({GPU_RECIPE}); "
                        "--force runs the CPU lane anyway")
    holder = lane_holder(lane_dir)
    if holder:
        print(f"lane: already {holder}; nothing started. Its runs:")
        print("\n".join(status_lines(lane_dir, Path(args.dir), () if args.no_studies else None)))
        return 0
    if args.background:
        log = open(lane_dir / "lane.log", "ab")
        child = subprocess.Popen(background_argv(args, lane_dir), cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, start_new_session=True)
        print(f"lane: started in the background (pid {child.pid}); log {lane_dir / 'lane.log'}; "
              "`python -m scripts.campaign cpu status` shows its runs")
        return 0
    lock = open(lane_dir / "lane.lock", "a+")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        print(f"lane: already {lane_holder(lane_dir) or 'running'}; nothing started")
        return 0
    lock.truncate(0)
    lock.write(f"pid {os.getpid()} since {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
    lock.flush()
    commit = git("rev-parse", "HEAD")
    lane = Lane(lane_dir, Path(args.dir), args.jobs, args.all, args.set,
                log=lambda m: print(f"{time.strftime('%H:%M:%S')} {m}", flush=True),
                studies=() if args.no_studies else None)
    signal.signal(signal.SIGTERM, lane.terminate)
    signal.signal(signal.SIGINT, lane.terminate)
    return lane.supervise(commit, once=args.once)


def stop(args) -> int:
    lane_dir = Path(args.lane_dir).expanduser()
    holder = lane_holder(lane_dir)
    if not holder:
        print("lane: not running")
        return 0
    pid = int(re.search(r"pid (\d+)", holder).group(1))
    os.kill(pid, signal.SIGTERM)
    print(f"lane: sent SIGTERM to {pid}; its trainings stop and resume from their last checkpoint at the next start")
    return 0


def add_parser(sub) -> None:
    c = sub.add_parser("cpu", help="the CPU lane: the headline cells' runs, one per core, in the background")
    c.add_argument("action", choices=("start", "status", "fold", "stop", "held", "checkpoint"),
                   help="held: the queue keys the lane has begun and not folded, one per line (a GPU "
                        "window's EXCLUDE file); checkpoint: each running training writes last.pt now "
                        "and goes on (before a session ends); stop: each writes one, then stops")
    c.add_argument("--lane-dir", default=str(DEFAULT_LANE_DIR),
                   help="run folders, code snapshots, locks and the log (outside the repository)")
    c.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="trainings at a time (one per core)")
    c.add_argument("--all", action="store_true", help="after the lane's cells, the rest of the queue in its order")
    c.add_argument("--background", action="store_true", help="start the lane detached; its output in lane.log")
    c.add_argument("--once", action="store_true", help="one pass: fold, start what fits, return (tests)")
    c.add_argument("--force", action="store_true", help="run on a machine with a GPU all the same")
    c.add_argument("--no-studies", action="store_true",
                   help="leave out the studies' stage (STUDIES: runs after the started ones, before the queue's)")
    c.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="an override every training gets; only keys that do not define a protocol. A study "
                        "run keeps the keys its line sets (e.g. the twins' model.conv_impl=gemm): a --set of "
                        "such a key is left out of that run's command")


def main(args) -> int:
    """``cpu start|stop|fold|status|held|checkpoint``; a :class:`LaneError` reaches the command line (one typed line)."""
    lane_dir, campaign_dir = Path(args.lane_dir).expanduser(), Path(args.dir)
    if args.action == "start":
        return start(args)
    if args.action == "stop":
        return stop(args)
    if args.action == "held":
        print("\n".join(held_keys(lane_dir, campaign_dir)))
        return 0
    if args.action == "checkpoint":
        folders = [f for f in (run_folder(lane_dir, k) for k in folder_keys(lane_dir)) if LaneRun(f).locked()]
        written = request_checkpoints(folders)
        print(f"lane: {len(written)} of {len(folders)} training(s) checkpointed; they go on training")
        return 0
    if args.action == "fold":
        folded = fold_finished(lane_dir, campaign_dir)
        print(f"lane: folded {len(folded)} run(s){': ' + ', '.join(folded) if folded else ''}")
        return 0
    print("\n".join(status_lines(lane_dir, campaign_dir, () if args.no_studies else None)))
    return 0
