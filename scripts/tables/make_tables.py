"""Regenerate the paper's tables from run folders (reads each run's results.json).

    python -m scripts.tables.make_tables multirun/<date>/<time> [more folders] --table binary
    python -m scripts.tables.make_tables outputs --table multiclass --lr-rule global --out results/tables/table2.md
    python -m scripts.tables.make_tables outputs --table f1 --format csv > f1.csv
    python -m scripts.tables.make_tables outputs --table eps --format latex
    python -m scripts.tables.make_tables results/paper_tables --table binary --select best-val   # + "pending" cells
    python -m scripts.tables.make_tables results/paper_tables --table binary --bn train   # the authors' BN evaluation

Tables: binary (test_auc, Meng et al. 2021, Table 1), multiclass / multiclass_mu (test_auc_ova /
test_auc_mu, Table 2), f1 / accuracy (test_f1 / test_acc, Meng et al. 2021 §5; Meng et al.,
ICLR 2021 version, Table 4): rows are objectives, columns dataset x imbalance level (neg_keep, or
drop_rate for the 3-group task). eps (test_auc, Meng et al., ICLR 2021 version, Table 2): rows
objective x dataset x neg_keep, columns objective.epsilon. The paper's number
(scripts/tables/paper_numbers.py) is printed beside ours.

Rules
1. A cell is the set of runs whose resolved configs agree on every key except ``seed`` and the
   keys in IGNORED (paths, logging, devices: none of them defines a protocol), and whose final
   evaluation is at the same step (a key missing from an older run's config counts as null, or as
   its ADDED_DEFAULTS value when it was added with the behaviour older runs had). It
   reports the test metric in % at that step: mean ± sample std over its runs (the seeds), and
   n. Runs of different length never share a cell.
2. Rows are objectives (the Hydra choice). Runs of one objective that differ in another key are
   separate rows named by the differing values, e.g. "auc_lp (objective.epsilon=0.1)".
   dataset.* and model.* keys may differ between columns (each dataset brings its own val size,
   source and model) but split rows within a column.
3. Learning rate, ``--lr-rule`` (the paper tunes it in {0.1, 0.01, 0.001} and says it used "the
   same random seed, learning rate and total number of iterations in all of our experiments"):
   per-cell (default): each (dataset, level, row) reports the lr with the best mean val metric
   over the seeds every lr of that cell ran (every seed when all lrs ran the same seeds; seed 0
   in the campaign, whose seeds 1-2 run only at seed 0's choice: queue_order.py);
   global: one lr for the whole table, the best mean over cells of the cell's val mean, counting
   only the cells every lr ran (all cells if none did); none: lr is an ordinary key (own rows).
   The val metric is the val_ version of the table's metric at the reported step; ties go to more
   seeds, then to the smaller lr. per-cell is the default: it is well defined for any set of runs
   and tunes every method alike, while global compares lrs fairly only when every lr ran in the
   same cells (use it on a full sweep for the paper's one-lr protocol). The caption (one lr) or
   each cell names the lr used.
4. ``--select`` (default final): which evaluation of each run is reported; best-val = the test
   metric at the run's best-validation evaluation, best-test = its highest test metric (selection
   on test, optimistic: the caption says so). A campaign ``queue.json`` (``--queue``, or found
   directly inside a folder given) adds its cells with no run as "pending" and counts, per cell,
   the queued runs still missing. Under the table: the code versions of its runs (results.json
   ``provenance``; "unrecorded" before it existed); a dagger marks a cell whose runs span versions.
5. ``--bn`` (default eval): the BatchNorm mode of the test numbers. Every evaluation records
   test in both modes (lpmetrics.run.evaluation.evaluate): ``test_<m>`` in the run's ``trainer.eval_bn`` mode
   (running statistics by default) and ``test_bntrain_<m>`` with each test batch of 32
   normalised by its own statistics (the authors' evaluation, binary_auc.py: their code never
   calls model.eval()). eval is the default because it is standard practice and the mode every
   run's validation is measured in (the lr choice and best-val select on it); train compares
   with the paper's numbers. Under train a run reports its ``test_bntrain_<m>`` (a run configured
   ``trainer.eval_bn=train``: its own ``test_<m>``), and a run that did not record it (made before
   every evaluation scored both modes) counts as n/a: never replaced by its other number. Runs
   configured ``trainer.eval_bn=train`` keep rows of their own (the key is part of the protocol),
   with their own test numbers under either option.
6. Everything found but not placed (no results.json, another task, metric missing, lr not
   selected) is listed on stderr; if nothing can be placed the script exits with status 1, as
   for a folder that does not exist or a queue it cannot read: one line, ``make_tables: <type>:
   <message>``, no traceback.
7. Where a run ran (device, precision, the convolutions of its step) is no part of a protocol:
   a CPU run and a GPU run of one protocol share a cell. Under the table a footnote names, per
   cell, the devices and precisions of its runs wherever one of them is not a GPU in fp32
   (results.json ``device``, ``provenance.device_name``, ``trainer.precision``, the ``conv``
   record of ``model.conv_impl`` and a compiled optimizer step, ``trainer.optimizer_impl``); a
   table of GPU fp32 runs has no such line.
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import re
import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from lpmetrics.run.upgrade import ADDED_DEFAULTS  # keys added later, with their old behaviour
from lpmetrics.run.targets import short_targets
from scripts.tables import queue_order
from scripts.tables.paper_numbers import PAPER
from scripts.tables.queue_cells import (LEDGER_FILE, QueueFileError, done_keys, expected_cells, find_queue,
                                        queued_labels, read_json, row_name)

IGNORED = (  # config keys (and their sub-keys) that never define a protocol
    "seed",                     # the cell's sample axis: pooled, never split on
    "device", "resume",         # where it ran, whether it was continued: same computation
    "logger", "hydra",          # csv or wandb, Hydra's own settings
    "dataset.root", "dataset.cache_dir", "dataset.download",   # where the data files live
    "trainer.eval_batch_size", "trainer.num_workers", "trainer.log_every",  # speed, progress bar
    "trainer.eval_every",       # when val/test are measured; the last eval is at max_steps anyway
    "trainer.checkpoints",      # whether best.pt / last.pt were written
    "trainer.bntrain_batch_size",   # the extra BN-train test evaluation (read with --bn train)
    "trainer.trust_checkpoint",     # whether an old pickled checkpoint may be loaded (not what it trains)
    "model.conv_impl",          # torchvision's convolutions or the same network's as GEMMs: one model
    "trainer.optimizer_impl",   # the optimizer's eager step or the same step compiled: one update rule
)
COLUMN_PREFIXES = ("dataset.", "model.")  # may differ between columns, not inside one
LR_KEY = "optimizer.lr"
SELECT = {  # --select: which evaluation of each run a cell reports (the caption's first words)
    "final": "Test {m} in % at the final evaluation",
    "best-val": "Test {m} in % at each run's evaluation with the best val_{m}",
    "best-test": "Max test {m} in % over each run's evaluations (selection on test, optimistic)",
}
UNRECORDED = "unrecorded"   # a run from before results.json carried its code version
BN_NA = "made before every evaluation scored both BatchNorm modes"
#: --bn: the BatchNorm mode of the test numbers (rule 5), and the caption note it adds (none for
#: the default, whose tables read as they always have)
BN = {"eval": None,
      "train": "--bn train: test with BatchNorm in train mode, each test batch (32 images unless "
               "trainer.bntrain_batch_size says otherwise) normalised by its own statistics, as the "
               "authors' code evaluates (columns test_bntrain_*; a trainer.eval_bn=train run's own "
               "test_*); val, so the lr choice and best-val, stays in eval mode."}
TEX = {"\\": "\\textbackslash{}", "_": "\\_", "%": "\\%", "&": "\\&", "#": "\\#", "{": "\\{", "}": "\\}",
       "$": "\\$", "±": "$\\pm$", "·": "$\\cdot$"}


class NothingToPlaceError(ValueError):
    """No run and no queued cell fits the table asked for (the lines logged before it say why
    each run found was not placed)."""


#: a user's errors (a folder that does not exist, nothing to place, a queue or ledger that cannot
#: be read): :func:`main` prints the message as one line and exits with status 1
USER_ERRORS = (FileNotFoundError, NothingToPlaceError, QueueFileError)


@dataclass(frozen=True)
class Table:
    metric: str               # results.json "final" key without its test_/val_ prefix
    task: str                 # dataset.task the table is about
    level: str                # imbalance key under dataset.
    pivot: str | None = None  # a config key that becomes the columns (the eps ablation)


TABLES = {
    "binary": Table("auc", "binary", "neg_keep"),
    "multiclass": Table("auc_ova", "multiclass", "drop_rate"),
    "multiclass_mu": Table("auc_mu", "multiclass", "drop_rate"),
    "f1": Table("f1", "binary", "neg_keep"),
    "accuracy": Table("acc", "binary", "neg_keep"),
    "eps": Table("auc", "binary", "neg_keep", pivot="objective.epsilon"),
}


@dataclass
class Run:
    path: Path
    name: str                 # objective choice
    where: tuple              # (dataset, level) or (dataset, level, pivot value)
    lr: float | None
    seed: object
    test: float | None        # %; None: not recorded in the --bn mode asked (n/a)
    val: float | None         # %
    key: dict                 # protocol: config minus IGNORED and `where` keys (and lr unless rule none)
    label: str = ""
    commit: str = UNRECORDED  # code version (results.json provenance)
    setup: str = ""           # device, precision, convolutions it ran with (run_setup)
    plain: bool = True        # ... a GPU in fp32 with torchvision's convolutions, or unrecorded
    device_name: str | None = None   # the CPU's or GPU's model (results.json provenance)


@dataclass
class Cell:
    where: tuple
    label: str
    name: str
    lr: float | None
    runs: list = field(repr=False)
    pending: int = 0          # queued runs of this cell (every lr and seed) not done yet

    @property
    def scored(self) -> list[Run]:
        """The runs with a test number (under ``--bn train`` some may be n/a)."""
        return [r for r in self.runs if r.test is not None]

    def stat(self, attr: str = "test") -> tuple[float, float | None]:
        xs = [getattr(r, attr) for r in self.scored]
        return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else None)

    @property
    def step(self):
        return self.runs[0].key.get("step")


def flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:  # lists -> JSON text: hashable and printable
            out[prefix + k] = json.dumps(v) if isinstance(v, list) else v
    return out


def ignored(key: str) -> bool:
    return any(key == i or key.startswith(i + ".") for i in IGNORED)


def protocol(config: dict) -> dict:
    """A run's flattened config minus the keys that never define a protocol (IGNORED), with the
    keys added later at their old behaviour: two runs of one protocol (any seed aside) agree on it."""
    flat = ADDED_DEFAULTS | short_targets(flatten(config))
    return {k: v for k, v in flat.items() if not ignored(k)}


def code_version(res: dict) -> str:
    """The short commit behind a run ("+dirty" with uncommitted changes), from its provenance."""
    prov = res.get("provenance") or {}
    commit = str(prov.get("git_commit") or UNRECORDED)
    return (commit[:7] if len(commit) == 40 else commit) + ("+dirty" if prov.get("git_dirty") else "")


#: a run's convolutions when it names no other (torchvision's modules; ``auto`` chooses per machine)
PLAIN_CONV = (None, "stock", "auto")


def step_record(res: dict, cfg: dict) -> tuple[str | None, str | None]:
    """(convolutions, precision) of a run's step from its results.json ``conv_impl`` record (what
    ``model.conv_impl`` resolved to, written by ``run.job``: ``impl`` stock, gemm, mixed or mixed16, and its
    ``precision``), else the flattened config's ``model.conv_impl`` (a run made before the record)."""
    rec = res.get("conv_impl")
    if isinstance(rec, dict):
        return rec.get("impl"), rec.get("precision")
    return cfg.get("model.conv_impl"), None


def run_setup(res: dict, cfg: dict) -> tuple[str, bool]:
    """``(what a run ran on, whether that is the tables' plain case)``, e.g.
    ``("cpu bf16, gemm convolutions", False)``. The plain case is a GPU in fp32 with torchvision's
    convolutions; a run that did not record its device counts as plain (nothing to say). Read
    from results.json: ``device`` (cpu, cuda, ...), the config's ``trainer.precision`` and the
    ``conv_impl`` record (:func:`step_record`), and the ``optimizer_impl`` record where the step was
    compiled (``trainer.optimizer_impl``). None of these is part of a protocol (IGNORED): a CPU
    and a GPU run of one protocol share a cell, and the table's footnote names the mix
    (:func:`setups`)."""
    device = res.get("device")
    conv, recorded = step_record(res, cfg)
    precision = recorded or str(cfg.get("trainer.precision", "fp32"))
    stepped = res.get("optimizer_impl")
    compiled = isinstance(stepped, dict) and stepped.get("impl") == "compiled"
    text = ((str(device).split(":")[0] if device else "device unrecorded") + f" {precision}"
            + ("" if conv in PLAIN_CONV else f", {conv} convolutions")
            + (", compiled optimizer step" if compiled else ""))
    plain = not device or (str(device).startswith("cuda") and precision == "fp32" and conv in PLAIN_CONV)
    return text, plain


def _number(v) -> float | None:
    try:
        return None if v in (None, "") else float(v)
    except (TypeError, ValueError):
        return None


def test_column(metric: str, bn: str, run_bn: str) -> str:
    """The column holding the test metric in BatchNorm mode ``bn`` (``--bn``) of a run evaluated
    in ``run_bn`` (its ``trainer.eval_bn``): its own ``test_<m>``, except ``test_bntrain_<m>``
    for ``--bn train`` of a run evaluated in eval mode (rule 5)."""
    return f"test_bntrain_{metric}" if bn == "train" and run_bn != "train" else f"test_{metric}"


def selected(res: dict, folder: Path, metric: str, select: str,
             column: str | None = None) -> tuple[float | None, float | None]:
    """(test, val) of the table's metric at the evaluation ``select`` names (fractions).
    best-val / best-test read every row of ``metrics.csv`` (``results.json``'s final and best_val
    rows where there is none) that has the run's own test and val metrics; best-val takes the
    first row with the highest val (as train.py keeps its best), best-test the highest test and,
    for the lr choice, the highest val. ``column`` (default ``test_<metric>``): where the test
    number is read (:func:`test_column`); best-val picks the same row whatever it is, and a row
    without it gives None (n/a)."""
    test_key, val_key = f"test_{metric}", f"val_{metric}"
    column = column or test_key
    final = res["final"]
    if select == "final":
        return final.get(column), final.get(val_key)
    path = folder / "metrics.csv"
    rows = list(csv.DictReader(io.StringIO(path.read_text()))) if path.is_file() else \
        [r for r in (final, res.get("best_val")) if r]
    rows = [r for r in rows if _number(r.get(test_key)) is not None and _number(r.get(val_key)) is not None]
    if not rows:
        return None, None
    if select == "best-val":
        best = max(rows, key=lambda r: _number(r[val_key]))   # max returns the first of equal vals
        return _number(best.get(column)), _number(best[val_key])
    tests = [t for t in (_number(r.get(column)) for r in rows) if t is not None]
    return (max(tests) if tests else None), max(_number(r[val_key]) for r in rows)


def load(folders: list[Path], table: Table, lr_rule: str, log, select: str = "final",
         bn: str = "eval") -> list[Run]:
    """Runs of the table's task that carry its metric; everything else is reported through log.
    A run without the test number of ``bn`` (rule 5) is kept, as n/a."""
    found = {p.resolve(): p for f in folders for p in sorted(f.rglob("results.json"))}
    done = {p.parent for p in found}
    unfinished = sorted({p.parent for f in folders for p in f.rglob("metrics.csv")
                         if p.parent.resolve() not in done})
    log(f"found {len(found)} results.json under {', '.join(map(str, folders))}")
    skipped: dict[str, list] = defaultdict(list)
    skipped["no results.json (unfinished or still running)"] = unfinished
    unscored: dict[str, list] = defaultdict(list)
    test_key, val_key = f"test_{table.metric}", f"val_{table.metric}"
    where_keys = ["dataset.name", f"dataset.{table.level}"] + ([table.pivot] if table.pivot else [])
    runs = []
    for path in found.values():
        try:
            res = json.loads(path.read_text())
            cfg, final = ADDED_DEFAULTS | flatten(res["config"]), dict(res["final"])
        except (ValueError, KeyError, TypeError) as err:
            skipped[f"unreadable (need 'config' and 'final': {type(err).__name__})"].append(path)
            continue
        task = cfg.get("dataset.task", "binary")
        missing = f"no {test_key} in final"
        column = test_column(table.metric, bn, cfg.get("trainer.eval_bn"))
        if select != "final" and final.get(test_key) is not None:
            final[column], final[val_key] = selected(res, path.parent, table.metric, select, column)
            if final[val_key] is None:   # no evaluation to select from
                final[test_key] = None
            missing = (f"--select {select}: no evaluation has both {test_key} and {val_key} (a run "
                       "without a validation split, e.g. dataset.split=authors, has nothing to "
                       "select on: use --select final)")
        if task != table.task:
            skipped[f"task={task}, this table is task={table.task}"].append(path)
        elif final.get(test_key) is None:
            skipped[missing].append(path)
        elif lr_rule != "none" and final.get(val_key) is None:
            skipped[f"no {val_key} in final (needed to pick the lr; or use --lr-rule none)"].append(path)
        elif any(k not in cfg for k in where_keys):
            skipped[f"config lacks one of {', '.join(where_keys)}"].append(path)
        else:
            where = (cfg["dataset.name"], *(float(cfg[k]) for k in where_keys[1:]))
            skip = set(where_keys) | ({LR_KEY} if lr_rule != "none" else set())
            key = {k: v for k, v in protocol(res["config"]).items() if k not in skip} | {"step": final.get("step")}
            name = res.get("choices", {}).get("objective") or str(cfg.get("objective._target_")).split(".")[-1]
            val = None if final.get(val_key) is None else 100 * final[val_key]
            test = None if final.get(column) is None else 100 * final[column]
            if test is None:
                unscored[column].append(path)
            setup, plain = run_setup(res, cfg)
            runs.append(Run(path, name, where, cfg.get(LR_KEY), cfg.get("seed"), test, val, key,
                            commit=code_version(res), setup=setup, plain=plain,
                            device_name=(res.get("provenance") or {}).get("device_name")))
    for reason, bad in skipped.items():
        if bad:
            where = ", ".join(str(p.parent if p.name == "results.json" else p) for p in bad)
            log(f"not placed, {reason}: {len(bad)} run(s): {where}")
    for column, bad in unscored.items():
        log(f"n/a, no {column} recorded ({BN_NA}): {len(bad)} run(s): "
            + ", ".join(str(p.parent) for p in bad))
    return runs


def label_rows(runs: list[Run], log) -> None:
    """Name each run's row: its objective plus the keys on which that objective's runs differ."""
    by_name: dict[str, list[Run]] = defaultdict(list)
    for r in runs:
        by_name[r.name].append(r)
    for name, group in by_name.items():
        columns: dict[tuple, list[Run]] = defaultdict(list)
        for r in group:
            columns[r.where].append(r)

        def varies(k, rs):
            return len({r.key.get(k) for r in rs}) > 1
        split = sorted(k for k in set().union(*(r.key for r in group))
                       if (any(varies(k, rs) for rs in columns.values()) if k.startswith(COLUMN_PREFIXES)
                           else varies(k, group)))
        if {"step", "trainer.max_steps"} <= set(split) and all(r.key["step"] == r.key.get("trainer.max_steps")
                                                               for r in group):
            split.remove("step")  # implied by max_steps
        if split:
            log(f"{name}: runs differ in {', '.join(split)}: one row per value")
        for r in group:
            r.label = name + (" (" + ", ".join(f"{k}={r.key.get(k)}" for k in split) + ")" if split else "")


def where_text(where: tuple) -> str:
    return " ".join([where[0]] + [f"{x:g}" for x in where[1:]])


def _lr_order(lr):
    return -1.0 if lr is None else -lr  # max() prefers this on ties: the smaller lr


def select(runs: list[Run], rule: str, val_name: str, log) -> tuple[list[Cell], str]:
    """Pool runs into cells, keep one lr per (where, row) by the rule; returns cells and a caption line."""
    options: dict[tuple, dict] = defaultdict(lambda: defaultdict(list))
    for r in runs:
        options[(r.where, r.label)][r.lr].append(r)

    def val_mean(rs):
        return statistics.fmean(r.val for r in rs)
    if rule == "global":
        lrs = sorted({lr for o in options.values() for lr in o}, key=_lr_order)
        shared = [o for o in options.values() if len(o) == len(lrs)]
        basis = shared or list(options.values())
        means = {lr: statistics.fmean(val_mean(o[lr]) for o in basis if lr in o) for lr in lrs}
        best = max(lrs, key=lambda lr: (means[lr], _lr_order(lr)))
        chosen = {k: best for k, o in options.items() if best in o}
        how = f"the {len(basis)} cells every lr ran" if shared else "each lr's own cells (no cell ran every lr)"
        if not shared and len(lrs) > 1:
            log("warning: --lr-rule global compares lrs on different cells (no cell ran every lr); "
                "per-cell or none compares like with like")
        caption = (f"lr {best:g} for the whole table (--lr-rule global: best mean {val_name} over {how}: "
                   + ", ".join(f"lr {lr:g} {m:.2f}" for lr, m in means.items()) + ")")
        empty = [f"{k[1]} @ {where_text(k[0])}" for k in options if k not in chosen]
        if empty:
            log(f"not placed, no run at the selected lr {best:g}: cells {', '.join(empty)}")
    else:
        def shared_mean(o, lr):   # compare lrs on the seeds every lr of the cell ran (all of them
            # when no seed is shared): with the campaign's seeds 1-2 at seed 0's choice only, the
            # choice is seed 0's, so the lr reported is the one all three seeds ran at
            seeds = set.intersection(*({str(r.seed) for r in rs} for rs in o.values()))
            return val_mean([r for r in o[lr] if str(r.seed) in seeds] or o[lr])
        chosen = {k: max(o, key=lambda lr: (shared_mean(o, lr), len(o[lr]), _lr_order(lr)))
                  if len(o) > 1 else next(iter(o)) for k, o in options.items()}
        lrs = set(chosen.values())
        caption = (f"lr {lrs.pop():g}" if len(lrs) == 1 else "lr named in each cell or row") + (
            f" (--lr-rule per-cell: best mean {val_name} per cell)" if rule == "per-cell"
            else " (--lr-rule none: lr is part of the protocol)")
    cells = [Cell(k[0], k[1], options[k][lr][0].name, lr, options[k][lr]) for k, lr in chosen.items()]
    dropped = [str(r.path.parent) for k, lr in chosen.items()
               for other, rs in options[k].items() if other != lr for r in rs]
    if dropped:
        log(f"not selected, other lr: {len(dropped)} run(s): {', '.join(dropped)}")
    for c in cells:
        seeds = [r.seed for r in c.runs]
        if len(set(map(str, seeds))) < len(seeds):
            log(f"warning: {c.label} @ {where_text(c.where)} has repeated seeds {seeds}; n counts runs")
    return cells, caption


def paper(table: str, where: tuple, name: str) -> float | None:
    return PAPER.get(table, {}).get(where, {}).get(name)


def with_pending(cells: list[Cell], pending: dict, labels: dict[str, str]) -> list[Cell]:
    """``cells`` with each queued cell's count of runs not done yet (``pending``:
    ``{(where, objective): (expected, done)}``), and an empty cell where none is done; a queued
    cell takes the row its objective's queued runs are in (``labels``), else the objective's name."""
    out = list(cells)
    for (where, name), (expected, done) in pending.items():
        label = labels.get(name, name)
        mine = [c for c in cells if c.where == where and c.name == name and c.label == label]
        for c in mine:
            c.pending = max(0, expected - done)
        if not mine:
            out.append(Cell(where, label, name, None, [], pending=max(0, expected - done)))
    return out


def code_versions(cells: list[Cell]) -> str:
    """``code versions: <commit>(n runs), ...`` over the runs the table shows, most runs first."""
    counts: dict[str, int] = defaultdict(int)
    for c in cells:
        for r in c.runs:
            counts[r.commit] += 1
    if not counts:
        return "code versions: none (no run done yet)"
    return "code versions: " + ", ".join(f"{v}({n} run{'s' * (n > 1)})"
                                         for v, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def setups(cells: list[Cell]) -> str:
    """The footnote naming, per cell, the devices and precisions of its runs where any of them is
    not the plain case (a GPU in fp32: :func:`run_setup`), then the device models of those runs;
    ``""`` when none is, so a table of GPU fp32 runs prints as it always has. Cells with the same
    mix are listed together ("every cell" when all cells with runs share one)."""
    shown = [c for c in cells if c.runs]
    groups: dict[str, list[Cell]] = defaultdict(list)
    for c in shown:
        if not all(r.plain for r in c.runs):
            groups[" + ".join(sorted({r.setup for r in c.runs}))].append(c)
    if not groups:
        return ""
    parts = [f"{mix}: " + ("every cell" if len(group) == len(shown) else
                           ", ".join(f"{c.label} @ {where_text(c.where)}" for c in group))
             for mix, group in sorted(groups.items())]
    models: dict[str, set[str]] = defaultdict(set)
    for group in groups.values():
        for r in (r for c in group for r in c.runs):
            models[r.setup.split(",")[0].rsplit(" ", 1)[0]].add(r.device_name or UNRECORDED)
    return ("runs not on a GPU in fp32 (device, precision): " + "; ".join(parts) + " (models: "
            + "; ".join(f"{kind} {', '.join(sorted(names))}" for kind, names in sorted(models.items())) + ")")


def cell_text(c: Cell, lr_shown: bool, step_shown: bool) -> str:
    """``mean ± std (n=.., lr=.., step .., k pending)``, a dagger if its runs span code versions."""
    if not c.runs:
        return "pending"
    unscored = len(c.runs) - len(c.scored)
    count = ([f"n={len(c.scored)}"] + [f"{unscored} n/a"] * (unscored > 0) if c.scored
             else [f"{unscored} run{'s' * (unscored > 1)} unrecorded"])
    notes = (count + [f"lr={c.lr:g}"] * lr_shown + [f"step {c.step}"] * step_shown
             + [f"{c.pending} pending"] * (c.pending > 0))
    dagger = " †" if len({r.commit for r in c.runs}) > 1 else ""
    if not c.scored:
        return f"n/a ({', '.join(notes)}){dagger}"
    mean, std = c.stat()
    return f"{mean:.1f}" + (f" ± {std:.1f}" if std is not None else "") + f" ({', '.join(notes)}){dagger}"


def grid(cells: list[Cell], table: str, select: str = "final",
         bn: str = "eval") -> tuple[list[str], list[tuple[str, list[str]]], list[str]]:
    """Header, rows of (label, cell texts) and caption notes, shared by Markdown and LaTeX."""
    spec = TABLES[table]
    order = {n: i for i, n in enumerate(dict.fromkeys(o for v in PAPER.get(table, {}).values() for o in v))}

    def place(c: Cell):  # -> ((row sort key, row label), column)
        rank = (order.get(c.name, len(order)), c.label)
        if spec.pivot:
            return (rank + c.where[:2], f"{c.label} · {c.where[0]} {c.where[1]:g}"), c.where[2]
        return (rank, c.label), c.where
    placed = {place(c): c for c in cells}
    rows = sorted({r for r, _ in placed})
    flip = -1 if spec.level == "drop_rate" else 1  # the paper's order: most imbalanced first
    cols = sorted({col for _, col in placed}, key=lambda col: -col if spec.pivot else (col[0], flip * col[1]))
    lrs, steps = {c.lr for c in cells if c.runs}, {c.step for c in cells if c.runs}
    out = []
    for row in rows:
        name = next(c.name for (r, _), c in placed.items() if r == row)
        texts = []
        for col in cols:
            c, text = placed.get((row, col)), "-"
            if c:
                text = cell_text(c, len(lrs) > 1 and f"{LR_KEY}=" not in c.label, len(steps) > 1)
            ref = paper(table, (*row[0][2:], col) if spec.pivot else col, name)
            texts.append(text + (f" [paper {ref:.1f}]" if ref is not None else ""))
        out.append((row[1], texts))
    head = [f"eps={col:g}" for col in cols] if spec.pivot else [f"{d} {lvl:g}" for d, lvl in cols]
    what = f"{spec.pivot}; rows: objective · dataset {spec.level}" if spec.pivot else f"dataset {spec.level}"
    notes = [SELECT[select].format(m=spec.metric) + ", mean ± sample std over seeds (n runs); "
             f"[paper x] = Meng et al. 2021. Columns: {what}.",
             f"Step {steps.pop()}." if len(steps) == 1 else
             "Steps differ: each cell names its step." if steps else "No run done yet."]
    if BN[bn]:
        notes.insert(1, BN[bn])
    if any(len(c.scored) < len(c.runs) for c in cells):
        notes.append(f"n/a: runs that did not record this evaluation ({BN_NA}).")
    if any(c.pending or not c.runs for c in cells):
        notes.append("pending: queued runs not done yet (k pending: of the cell's runs at every lr and seed).")
    if any(" †" in t for _, texts in out for t in texts):
        notes.append("†: the cell's runs come from more than one code version.")
    return head, out, notes


def to_csv(cells: list[Cell], table: str) -> str:
    """One row per cell; with a queue, a ``pending`` column and rows for cells with no run yet."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    queued = any(c.pending or not c.runs for c in cells)
    w.writerow(["dataset", "level", "objective", "selected_lr", "n_seeds", "mean", "std", "paper", "step", "val_mean"]
               + ["epsilon"] * bool(TABLES[table].pivot) + ["pending"] * queued)
    for c in sorted(cells, key=lambda c: (c.where, c.label)):
        mean, std = c.stat() if c.scored else (None, None)
        val = c.stat("val")[0] if c.scored and all(r.val is not None for r in c.scored) else None
        ref = paper(table, c.where, c.name)
        w.writerow([c.where[0], f"{c.where[1]:g}", c.label, "" if c.lr is None else f"{c.lr:g}", len(c.scored),
                    "" if mean is None else f"{mean:.4f}", "" if std is None else f"{std:.4f}",
                    "" if ref is None else ref, c.step if c.runs else "",
                    "" if val is None else f"{val:.4f}", *(f"{x:g}" for x in c.where[2:])] + [c.pending] * queued)
    return buf.getvalue().rstrip("\n")


def render(cells: list[Cell], table: str, fmt: str, lr_caption: str, select: str = "final",
           bn: str = "eval") -> str:
    """The table in ``fmt``; Markdown lists the code versions under it, LaTeX in its caption."""
    if fmt == "csv":
        return to_csv(cells, table)
    head, rows, notes = grid(cells, table, select, bn)
    notes.append(lr_caption + ".")
    devices = setups(cells)
    if fmt == "markdown":
        return "\n".join(notes + ["", "| objective | " + " | ".join(head) + " |", "|---|" + "---:|" * len(head)]
                         + [f"| {label} | " + " | ".join(texts) + " |" for label, texts in rows]
                         + ["", code_versions(cells) + "."] + [devices + "."] * bool(devices))
    notes.append(code_versions(cells) + ".")
    if devices:
        notes.append(devices + ".")

    def tex(s: str) -> str:  # the table needs \usepackage{booktabs}
        return re.sub(r"[\\_%&#{}$±·]", lambda m: TEX[m.group()], s)
    lines = ["\\begin{table}", "\\caption{" + tex(" ".join(notes)) + "}",
             "\\begin{tabular}{l" + "r" * len(head) + "}", "\\toprule",
             " & ".join(["objective"] + [tex(h) for h in head]) + " \\\\", "\\midrule"]
    lines += [" & ".join([tex(label)] + [tex(t) for t in texts]) + " \\\\" for label, texts in rows]
    return "\n".join(lines + ["\\bottomrule", "\\end{tabular}", "\\end{table}"])


def placed(folders: list[Path], table: str, lr_rule: str, log, select_: str = "final", bn: str = "eval",
           queue_path: Path | None = None) -> tuple[list[Cell], str]:
    """The cells of ``table`` from the runs under ``folders`` (rules 1-5; rows of a queued run named
    by its queue entry) and the lr caption; with a ``queue_path``, its cells with no run as pending."""
    spec = TABLES[table]
    queue = read_json(queue_path, "queue") if queue_path else None
    runs = load(folders, spec, lr_rule, log, select_, bn)
    pending = {}
    if queue is not None:
        entries = {e["key"]: e for e in queue.get("entries", [])}
        for r in runs:   # a queued run's row: its objective and its arm (queue_cells.row_name)
            if r.path.parent.name in entries:
                r.name = row_name(entries[r.path.parent.name])
        names = {p.parent.name for f in folders for p in f.rglob("results.json")}
        ledger_path = queue_path.parent / LEDGER_FILE
        ledger = read_json(ledger_path, "ledger") if ledger_path.is_file() else {}
        wanted = queue_order.states(queue, ledger, queue_path.parent)   # the lr rules: what is still wanted
        pending = expected_cells(queue, table, spec.level, spec.pivot, done_keys(queue_path, names), wanted)
        log(f"queue {queue_path} (version {queue.get('version')}): {sum(n for n, _ in pending.values())} "
            f"runs in {len(pending)} cells of --table {table}, "
            f"{sum(d for _, d in pending.values())} done")
    if not runs and not pending:
        needs = f"test_{spec.metric}" + ("" if lr_rule == "none" else f" and val_{spec.metric}")
        raise NothingToPlaceError(f"nothing to place in --table {table} (task={spec.task}, needs "
                                  f"{needs}); see the lines above")
    label_rows(runs, log)
    cells, lr_caption = select(runs, lr_rule, f"val_{spec.metric}", log) if runs else \
        ([], "lr: none selected yet (no run done)")
    log(f"placed {sum(len(c.runs) for c in cells)} of {len(runs)} usable runs in {len(cells)} cells")
    if queue is not None:
        keys = {e["key"] for e in queue.get("entries", [])}
        cells = with_pending(cells, pending, queued_labels(runs, keys))
    return cells, lr_caption


def main(argv: list[str] | None = None) -> str:
    """The command line (:func:`run`): prints the table and returns its text; a user's error
    (:data:`USER_ERRORS`) ends as one line, ``make_tables: <type>: <message>``, with exit status 1."""
    try:
        return run(argv)
    except USER_ERRORS as err:
        raise SystemExit(f"make_tables: {type(err).__name__}: {err}") from err


def run(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folders", nargs="+", type=Path, help="run folders or folders of run folders")
    ap.add_argument("--table", choices=list(TABLES), default="binary")
    ap.add_argument("--lr-rule", choices=["per-cell", "global", "none"], default="per-cell")
    ap.add_argument("--format", choices=["markdown", "csv", "latex"], default="markdown")
    ap.add_argument("--out", type=Path, help="also write the table to this file")
    ap.add_argument("--select", choices=list(SELECT), default="final",
                    help="the evaluation each run reports: final (default), best-val (test at the best "
                         "val), best-test (max test: selection on test, optimistic)")
    ap.add_argument("--bn", choices=list(BN), default="eval",
                    help="BatchNorm mode of the test numbers: eval (default: running statistics, "
                         "standard practice and the mode of every run's own validation and selection) "
                         "or train (each test batch of 32 by its own statistics, the authors' "
                         "evaluation: to compare with the paper's numbers); a run that did not "
                         "record it reads n/a")
    ap.add_argument("--queue", type=Path, help="a campaign queue.json: its cells with no run read "
                    "'pending' (default: the queue.json directly inside a folder given, if any)")
    ap.add_argument("--no-queue", action="store_true", help="ignore any queue.json")
    args = ap.parse_args(argv)

    def log(msg: str) -> None:
        print(f"make_tables: {msg}", file=sys.stderr)
    missing = [str(f) for f in args.folders if not f.exists()]
    if missing:
        raise FileNotFoundError(f"no such folder: {', '.join(missing)}")
    queue_path = None if args.no_queue else (args.queue or find_queue(args.folders))
    cells, lr_caption = placed(args.folders, args.table, args.lr_rule, log, args.select, args.bn, queue_path)
    text = render(cells, args.table, args.format, lr_caption, args.select, args.bn)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return text


if __name__ == "__main__":
    main()
