"""The campaign's queue: every run the paper's tables need at 40k steps, in the order windows take
them (``results/paper_tables/queue.json``), and its ledger of what is done (``ledger.json``).

Each entry is a job of an experiment file (``configs/experiment/*.yaml``) composed with Hydra's
compose API as ``train.py -m experiment=E ...`` composes it; its ``config_sha`` is the hash of its
protocol (:func:`scripts.tables.make_tables.protocol`: the config minus paths, logging, devices, evaluation
interval), so a run folded back must have the same protocol, whichever machine ran it. An entry
that two tables share (the eps = 0.01 runs are Table 1's Cat&Dog LP runs; the F1 table's ``ce``
runs are Table 1's at 50 %) is queued once, with both tables. The queue's ``version`` hashes its
entries: returned files carry it and ``fold`` refuses another.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from scripts.campaign.jobs import ROOT, composer, jobs, sweep_axes
from scripts.tables.make_tables import LR_KEY, flatten, protocol
from scripts.tables.queue_cells import LEDGER_FILE, QUEUE_FILE, read_json

DEFAULT_DIR = ROOT / "results" / "paper_tables"
WHERE_KEYS = ("dataset.name", "dataset.neg_keep", "dataset.drop_rate", "objective.epsilon")


@dataclass(frozen=True)
class Section:
    """One stage of the queue: ``axes`` in queue order (outermost first; ``None`` = the experiment's
    own sweep values), the first ``block`` axes (a cell and its seed) make one block of whole runs.

    ``rule`` says which of the stage's runs are wanted (:mod:`scripts.tables.queue_order`): ``grid`` every lr;
    ``chosen`` only the lr that seed 0 of the same cell chose (its validation metric, the tables'
    per-cell rule), the others are not needed; ``anchor`` the lr that seed 0 of the cell that
    ``anchor`` names chose (the eps ablation at Table 1's lr), the others wait for stage ``later``.
    A run is wanted and planned only once its rule is decided (the seed-0 runs it reads are folded)."""

    tables: tuple[str, ...]
    experiment: str
    axes: dict
    block: int
    fixed: dict = field(default_factory=dict)
    why: str = ""
    # within each block, the runs of these objectives first (their lrs and objectives in axis
    # order), then the others: a block's single runs are taken in queue order, so a partly done
    # block has the comparison it is for (Table 1: the LP against cross-entropy) at every lr first
    first: tuple[str, ...] = ()
    rule: str = "grid"
    anchor: dict = field(default_factory=dict)   # overrides that name the anchor cell (rule anchor)
    later: str | None = None                     # the stage the anchor rule's other lrs join
    name: str = ""                               # the stage's name (default: its first table)

    @property
    def stage(self) -> str:
        return self.name or self.tables[0]


RULES = ("grid", "chosen", "anchor")
SEED0, SEEDS12 = ["0"], ["1", "2"]
T1_AXES = {"dataset.neg_keep": None, "dataset": ["cifar10", "catdog"], "seed": SEED0, "optimizer.lr": None,
           "objective": None}
AUG_AXES = {**T1_AXES, "dataset.neg_keep": ["0.1"]}
EPS_AXES = {"dataset.neg_keep": None, "seed": SEED0, "objective.epsilon": None, "optimizer.lr": None}

# The offline datasets only (CIFAR-10 and Cat&Dog packs; CIFAR-100 / STL-10 have none here). Queue
# order: seed 0 of every Table-1 cell first (its lr grid), then each cell's seeds 1-2 at the lr seed
# 0 chose, then the augmented arm, the compact eps ablation, F1, multi-class, the rest of the eps grid.
SECTIONS = (
    Section(("binary",), "table1_binary", T1_AXES, block=3, first=("ce", "auc_lp"),
            why="Table 1 (binary AUC), the paper's regime, seed 0 of every cell with the lr grid: CIFAR-10 "
                "91 %, Cat&Dog 91 %, then 83/71/50 %; in each cell ce and auc_lp before PPD-SG and PPD-AdaGrad", name="table1_seed0"),
    Section(("binary",), "table1_binary", {**T1_AXES, "seed": SEEDS12}, block=3,
            first=("ce", "auc_lp"), rule="chosen",
            why="Table 1, seeds 1 and 2 of each cell at the lr its seed-0 runs chose by validation AUC", name="table1_seeds12"),
    Section(("binary",), "table1_binary", AUG_AXES, block=4, fixed={"regime": "augmented"},
            first=("ce", "auc_lp"),
            why="the augmented arm (crop + flip, L2 5e-4: configs/regime/augmented.yaml) on the two 91 % "
                "cells, seed 0 with the lr grid", name="augmented_seed0"),
    Section(("binary",), "table1_binary", {**AUG_AXES, "seed": SEEDS12}, block=4,
            fixed={"regime": "augmented"}, first=("ce", "auc_lp"), rule="chosen",
            why="the augmented arm, seeds 1 and 2 at the lr seed 0 chose", name="augmented_seeds12"),
    Section(("eps",), "table_eps", EPS_AXES, block=2, fixed={"dataset": "catdog", "objective": "auc_lp"},
            rule="anchor", anchor={"objective.epsilon": "0.01"}, later="eps_grid",
            why="the eps ablation on Cat&Dog (Meng et al. ICLR 2021 version, Table 2), seed 0: eps 0.1 and "
                "0.001 at the lr Table 1's LP (eps 0.01) chose in the same cell; eps 0.01 = Table 1's LP runs", name="eps_compact"),
    Section(("f1", "accuracy"), "table_f1",
            {"dataset": ["cifar10", "catdog"], "seed": SEED0, "optimizer.lr": None, "objective": None},
            block=2, fixed={"dataset.neg_keep": "1.0"},
            why="F1 / accuracy at 50 % positives, seed 0 with the lr grid; ce = Table 1's ce runs at 50 %", name="f1_seed0"),
    Section(("f1", "accuracy"), "table_f1",
            {"dataset": ["cifar10", "catdog"], "seed": SEEDS12, "optimizer.lr": None, "objective": None},
            block=2, fixed={"dataset.neg_keep": "1.0"}, rule="chosen",
            why="F1 / accuracy, seeds 1 and 2 at the lr seed 0 chose by validation F1", name="f1_seeds12"),
    Section(("multiclass", "multiclass_mu"), "table2_multiclass",
            {"dataset.drop_rate": None, "seed": SEED0, "optimizer.lr": None, "objective": None},
            block=2, fixed={"dataset": "cifar10"},
            why="3-group multi-class AUC on CIFAR-10 (the offline stand-in for Table 2's STL-10 / CIFAR-100), "
                "seed 0 with the lr grid", name="multiclass_seed0"),
    Section(("multiclass", "multiclass_mu"), "table2_multiclass",
            {"dataset.drop_rate": None, "seed": SEEDS12, "optimizer.lr": None, "objective": None},
            block=2, fixed={"dataset": "cifar10"}, rule="chosen",
            why="3-group multi-class AUC, seeds 1 and 2 at the lr seed 0 chose by validation AUC^ova", name="multiclass_seeds12"),
    Section(("eps",), "table_eps", {**EPS_AXES, "seed": []}, block=2,
            fixed={"dataset": "catdog", "objective": "auc_lp"},
            why="the rest of the eps ablation's seed-0 lr grid (the eps_compact runs at the other lrs)", name="eps_grid"),
    Section(("eps",), "table_eps", {**EPS_AXES, "seed": SEEDS12}, block=2,
            fixed={"dataset": "catdog", "objective": "auc_lp"}, rule="chosen",
            why="the eps ablation, seeds 1 and 2 at the lr seed 0 chose for each eps", name="eps_seeds12"),
)
#: the validation metric that chooses a cell's lr, by the first table an entry fills (make_tables' tables)
SELECT_METRIC = {"binary": "val_auc", "eps": "val_auc", "f1": "val_f1", "accuracy": "val_acc",
                 "multiclass": "val_auc_ova", "multiclass_mu": "val_auc_mu"}


def config_sha(config: dict) -> str:
    """Hash of a run's protocol and seed (``config`` as results.json stores it): what makes it
    this run, wherever it ran (tables pool seeds; the queue must not)."""
    text = json.dumps(protocol(config) | {"seed": config.get("seed")}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def cell_sha(config: dict) -> str:
    """Hash of a run's protocol without its lr (and seed): the runs one lr choice is made among."""
    text = json.dumps({k: v for k, v in protocol(config).items() if k != LR_KEY}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def composed_config(cfg) -> dict:
    """A composed config as ``results.json`` stores it (:func:`runfolder.portable_config`)."""
    from lpmetrics.run import runfolder
    return runfolder.portable_config(cfg, ROOT)


def section_jobs(section: Section, compose) -> list[dict]:
    """The section's jobs in queue order, each with its block id."""
    declared = sweep_axes(section.experiment, compose)
    axes = {k: list(v) if v is not None else declared[k] for k, v in section.axes.items()}
    out = jobs(axes, fixed=section.fixed)
    for job in out:
        head = list(job["values"].items())[:len(section.fixed) + section.block]
        job["block"] = "/".join([section.tables[0]] + [f"{k}={v}" for k, v in head])
    if section.first:   # (a block's jobs are contiguous: its axes are the outermost)
        rank = {block: i for i, block in enumerate(dict.fromkeys(j["block"] for j in out))}
        out.sort(key=lambda j: (rank[j["block"]], j["values"].get("objective") not in section.first))
    return out


def runs_on(cfg) -> tuple[str, str]:
    """(``device`` | ``host``, why) for a composed job: ``device`` when its objective can train in a
    captured pack on a GPU (:func:`packed.graph.capture_form` finds it capturable or a capture-safe
    form), ``host`` when its loss needs the host every step (an LP layer solved on the CPU:
    cvxpylayers, AP-Perf; or no capture-safe form yet), which no GPU window can run to 40k."""
    import torch

    from lpmetrics.run.builders import instantiate_runtime
    from lpmetrics.packed.graph import capture_form
    k = 3 if cfg.dataset.get("task") == "multiclass" else 2
    try:
        objective = instantiate_runtime(cfg.objective, pos_ratio=0.5, num_classes=k, class_counts=[1] * k)
        if getattr(capture_form(objective, torch.device("cuda")), "capturable", False):
            return "device", ""
        return "host", f"{type(objective).__name__} has no capture-safe form (it needs the host every step)"
    except Exception as err:   # noqa: BLE001 -- an objective that cannot be built here is not device work
        return "host", f"its objective could not be built to check: {first_line(err)}"


def build(sections=SECTIONS, extra: tuple[str, ...] = (), log=print) -> dict:
    """The queue of ``sections`` (``extra``: overrides added to every job, e.g. a test's short
    runs). Jobs that do not compose are kept with their error; duplicates join the first."""
    entries, by_sha, where_run = [], {}, {}
    with composer() as compose:
        for section in sections:
            if section.rule not in RULES:
                raise ValueError(f"section {section.stage}: rule {section.rule!r} is not one of {RULES}")
            for job in section_jobs(section, compose):
                overrides = [*job["overrides"], *extra]
                entry = {"key": job["name"], "tables": list(section.tables), "experiment": section.experiment,
                         "overrides": overrides, "block": job["block"], "stage": section.stage,
                         "rule": section.rule}
                try:
                    cfg, choice = compose_entry(compose, overrides, section.experiment)
                    config = composed_config(cfg)
                    anchor = None
                    if section.rule == "anchor":
                        moved = [o for o in overrides if o.split("=", 1)[0] not in section.anchor]
                        acfg, _ = compose_entry(compose, [*moved, *(f"{k}={v}" for k, v in section.anchor.items())],
                                                section.experiment)
                        anchor = cell_sha(composed_config(acfg))
                except Exception as err:   # noqa: BLE001 -- kept and reported, never dropped
                    entries.append({**entry, "objective": job["values"].get("objective"), "where": {},
                                    "config_sha": None, "error": first_line(err)})
                    log(f"queue: {entry['key']} does not compose: {first_line(err)}")
                    continue
                sha = config_sha(config)
                if sha in by_sha:   # the same protocol in another table: one run fills both
                    first = by_sha[sha]
                    first["tables"] += [t for t in section.tables if t not in first["tables"]]
                    continue
                flat = _leaves(config)
                run_key = json.dumps(config["objective"], sort_keys=True, default=str) + str(cfg.dataset.get("task"))
                if run_key not in where_run:
                    where_run[run_key] = runs_on(cfg)
                entry.update(objective=choice, config_sha=sha, cell=cell_sha(config), seed=int(config["seed"]),
                             lr=float(flat["optimizer.lr"]), steps=int(cfg.trainer.max_steps),
                             metric=SELECT_METRIC[section.tables[0]],
                             where={k: flat[k] for k in WHERE_KEYS if k in flat},
                             runs_on=where_run[run_key][0])
                if where_run[run_key][1]:
                    entry["runs_on_why"] = where_run[run_key][1]
                if anchor:
                    entry.update(anchor_cell=anchor, later=section.later)
                if entry["key"] in {e["key"] for e in entries}:
                    raise ValueError(f"queue: two protocols are both named {entry['key']}: add the "
                                     "differing axis to scripts.campaign.jobs.NAME_PARTS")
                entries.append(entry)
                by_sha[sha] = entry
    return {"version": version(entries), "entries": entries,
            "stages": [s.stage for s in sections],
            "sections": [{"stage": s.stage, "tables": list(s.tables), "experiment": s.experiment, "rule": s.rule,
                          "why": s.why} for s in sections],
            "extra_overrides": list(extra),
            "made_by": "python -m scripts.campaign queue"}


def compose_entry(compose, overrides: list[str], experiment: str):
    """(config as train.py gets it, the objective's config name) of one job."""
    from omegaconf import open_dict
    cfg = compose(overrides, experiment, hydra=True)
    choice = cfg.hydra.runtime.choices.objective
    with open_dict(cfg):
        del cfg["hydra"]   # train.py's cfg has no hydra node
    return cfg, choice


def _leaves(config: dict) -> dict:
    return flatten(config)


def first_line(err: BaseException) -> str:
    """``Type: first line`` of an error (Hydra's add the search path: machine paths, no help)."""
    return f"{type(err).__name__}: " + (str(err).strip().splitlines() or [""])[0][:300]


#: entry fields that do not define the queue's version: where an entry can run follows the code
#: (an objective that gains a capture-safe form becomes device work) and is refreshed by ``queue``
UNVERSIONED = ("runs_on", "runs_on_why")


def version(entries: list[dict]) -> str:
    text = json.dumps([[e["key"], e["overrides"], e["experiment"], e["config_sha"], e["tables"],
                        e.get("stage"), e.get("rule"), e.get("anchor_cell")] for e in entries])
    return "q-" + hashlib.sha256(text.encode()).hexdigest()[:12]


def write_json(path: Path, data: dict) -> None:
    """Stable bytes (sorted keys, fixed indent): writing the same content twice changes nothing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(data, indent=1, sort_keys=True) + "\n"
    if not path.is_file() or path.read_text() != text:
        path.write_text(text)


def load(folder: Path) -> tuple[dict, dict]:
    """(queue, ledger) of a campaign folder; an empty ledger if none was written yet."""
    queue = read_json(folder / QUEUE_FILE, "queue")
    if "version" not in queue or "entries" not in queue:
        raise ValueError(f"{folder / QUEUE_FILE} is not a campaign queue (no version / entries)")
    ledger_path = folder / LEDGER_FILE
    ledger = read_json(ledger_path, "ledger") if ledger_path.is_file() else {}
    ledger.setdefault("queue_version", queue["version"])
    for k in ("runs", "extra"):
        ledger.setdefault(k, {})
    ledger.setdefault("attempts", [])
    return queue, ledger
