"""The campaign's queue: every run the paper's tables need at 40k steps, in the order windows take
them (``results/paper_tables/queue.json``), and its ledger of what is done (``ledger.json``).

Each entry is a job of an experiment file (``configs/experiment/*.yaml``) composed with Hydra's
compose API as ``train.py -m experiment=E ...`` composes it; its ``config_sha`` is the hash of its
protocol (:func:`make_tables.protocol`: the config minus paths, logging, devices, evaluation
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

from campaign_cells import LEDGER_FILE, QUEUE_FILE, read_json
from campaign_jobs import ROOT, composer, jobs, sweep_axes

DEFAULT_DIR = ROOT / "results" / "paper_tables"
WHERE_KEYS = ("dataset.name", "dataset.neg_keep", "dataset.drop_rate", "objective.epsilon")


@dataclass(frozen=True)
class Section:
    """One table's runs: ``axes`` in queue order (outermost first; ``None`` = the experiment's own
    sweep values), the first ``block`` axes (a cell and its seed) make one block of whole runs."""

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


# The offline datasets only (CIFAR-10 and Cat&Dog packs; CIFAR-100 / STL-10 have none here).
SECTIONS = (
    Section(("binary",), "table1_binary",
            {"dataset.neg_keep": None, "dataset": ["cifar10", "catdog"], "seed": None,
             "optimizer.lr": None, "objective": None}, block=3, first=("ce", "auc_lp"),
            why="Table 1 (binary AUC): the CIFAR-10 91 % cell first, then Cat&Dog 91 %, then 83/71/50 %; "
                "in each cell and seed, ce and auc_lp at every lr before PPD-SG and PPD-AdaGrad"),
    Section(("eps",), "table_eps",
            {"dataset.neg_keep": None, "seed": None, "objective.epsilon": None, "optimizer.lr": None},
            block=2, fixed={"dataset": "catdog", "objective": "auc_lp"},
            why="the epsilon ablation on Cat&Dog (seed 001 Table 2); eps 0.01 = Table 1's LP runs"),
    Section(("f1", "accuracy"), "table_f1",
            {"dataset": ["cifar10", "catdog"], "seed": None, "optimizer.lr": None, "objective": None},
            block=2, fixed={"dataset.neg_keep": "1.0"},
            why="F1 / accuracy at 50 % positives; ce = Table 1's ce runs at 50 %"),
    Section(("multiclass", "multiclass_mu"), "table2_multiclass",
            {"dataset.drop_rate": None, "seed": None, "optimizer.lr": None, "objective": None},
            block=2, fixed={"dataset": "cifar10"},
            why="3-group multi-class AUC on CIFAR-10 (the offline stand-in for Table 2's STL-10/CIFAR-100)"),
)


def config_sha(config: dict) -> str:
    """Hash of a run's protocol and seed (``config`` as results.json stores it): what makes it
    this run, wherever it ran (tables pool seeds; the queue must not)."""
    from make_tables import protocol
    text = json.dumps(protocol(config) | {"seed": config.get("seed")}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def composed_config(cfg) -> dict:
    """A composed config as ``results.json`` stores it (:func:`runfolder.portable_config`)."""
    import runfolder
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


def build(sections=SECTIONS, extra: tuple[str, ...] = (), log=print) -> dict:
    """The queue of ``sections`` (``extra``: overrides added to every job, e.g. a test's short
    runs). Jobs that do not compose are kept with their error; duplicates join the first."""
    entries, by_sha = [], {}
    with composer() as compose:
        for section in sections:
            for job in section_jobs(section, compose):
                overrides = [*job["overrides"], *extra]
                entry = {"key": job["name"], "tables": list(section.tables), "experiment": section.experiment,
                         "overrides": overrides, "block": job["block"]}
                try:
                    cfg, choice = compose_entry(compose, overrides, section.experiment)
                    config = composed_config(cfg)
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
                entry.update(objective=choice, config_sha=sha, steps=int(cfg.trainer.max_steps),
                             where={k: flat[k] for k in WHERE_KEYS if k in flat})
                if entry["key"] in {e["key"] for e in entries}:
                    raise ValueError(f"queue: two protocols are both named {entry['key']}: add the "
                                     "differing axis to campaign_jobs.NAME_PARTS")
                entries.append(entry)
                by_sha[sha] = entry
    return {"version": version(entries), "entries": entries,
            "sections": [{"tables": list(s.tables), "experiment": s.experiment, "why": s.why} for s in sections],
            "extra_overrides": list(extra),
            "made_by": "python scripts/campaign.py queue"}


def compose_entry(compose, overrides: list[str], experiment: str):
    """(config as train.py gets it, the objective's config name) of one job."""
    from omegaconf import open_dict
    cfg = compose(overrides, experiment, hydra=True)
    choice = cfg.hydra.runtime.choices.objective
    with open_dict(cfg):
        del cfg["hydra"]   # train.py's cfg has no hydra node
    return cfg, choice


def _leaves(config: dict) -> dict:
    from make_tables import flatten
    return flatten(config)


def first_line(err: BaseException) -> str:
    """``Type: first line`` of an error (Hydra's add the search path: machine paths, no help)."""
    return f"{type(err).__name__}: " + (str(err).strip().splitlines() or [""])[0][:300]


def version(entries: list[dict]) -> str:
    text = json.dumps([[e["key"], e["overrides"], e["experiment"], e["config_sha"], e["tables"]] for e in entries])
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
