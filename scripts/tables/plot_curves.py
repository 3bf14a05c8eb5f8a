"""Learning curves of finished runs: one line per setting (mean over seeds), thin lines per seed.

    python -m scripts.tables.plot_curves results/lp_vs_ce_cifar10 --metric val_auc --out curves.png

Runs are grouped exactly as ``scripts/tables/make_tables.py`` pools a cell (same config except ``seed``,
same length; the learning rate is a key like any other here), so a curve never mixes protocols.
Each run's ``metrics.csv`` gives the points; the legend names the setting and the seed count.
``--panels`` draws one panel per objective (the label before its ``(...)``) on a shared y axis,
each setting's rest (``optimizer.lr=0.01``, say) in the same colour in every panel: a cell's
objectives x learning rates without twelve lines in one axes.
"""
from __future__ import annotations

import argparse
import csv
import sys
from collections import defaultdict
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from scripts.tables.make_tables import TABLES, label_rows, load  # (one grouping rule, not two)


def curves(folders: list[Path], metric: str, table: str = "binary") -> dict[str, list[list[tuple]]]:
    """``{setting label: [per-seed [(step, value), ...]]}`` for the runs make_tables would place."""
    def log(msg: str) -> None:
        print(msg, file=sys.stderr)

    runs = load(folders, TABLES[table], "none", log)
    label_rows(runs, log)
    out: dict[str, list] = defaultdict(list)
    for run in sorted(runs, key=lambda r: (r.label, str(r.seed))):
        with open(run.path.parent / "metrics.csv", newline="") as fh:
            rows = [r for r in csv.DictReader(fh) if r.get(metric) not in (None, "")]
        label = run.label + ("" if len({r.where for r in runs}) == 1 else f" [{' '.join(map(str, run.where))}]")
        out[label].append([(int(r["step"]), float(r[metric])) for r in rows])
    return dict(out)


def draw(ax, seeds: list[list[tuple]], label: str, color: str, style: str = "-") -> None:
    """One setting: a thin line per seed, the mean over the steps all seeds share bold."""
    for pts in seeds:
        ax.plot(*zip(*pts), color=color, ls=style, lw=0.7, alpha=0.45)
    steps = sorted(set.intersection(*(set(s for s, _ in pts) for pts in seeds)))
    mean = [sum(dict(pts)[s] for pts in seeds) / len(seeds) for s in steps]
    ax.plot(steps, mean, color=color, ls=style, lw=2, label=f"{label} (n={len(seeds)})")


def plot(groups: dict[str, list[list[tuple]]], metric: str, path: Path, title: str = "") -> None:
    # more than ten settings: the legend goes below the axes (it hid the curves) and the
    # colours repeat with a dashed line, so no two settings look alike
    many = len(groups) > 10
    fig = Figure(figsize=(7.5, 4.5 + (0.17 * len(groups) if many else 0)))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for i, (label, seeds) in enumerate(sorted(groups.items())):
        draw(ax, seeds, label, f"C{i % 10}", "-" if i < 10 else "--")
    ax.set(xlabel="step", ylabel=metric, title=title)
    ax.grid(alpha=0.3)
    if many:
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=1)
    else:
        ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def split_label(label: str) -> tuple[str, str]:
    """``("auc_lp", "optimizer.lr=0.01")`` from ``"auc_lp (optimizer.lr=0.01)"``; ``(label, "")``
    for a label without a parenthesised rest."""
    head, sep, rest = label.partition(" (")
    return (head, rest[:-1] if rest.endswith(")") else rest) if sep else (label, "")


def plot_panels(groups: dict[str, list[list[tuple]]], metric: str, path: Path, title: str = "") -> None:
    """One panel per objective (:func:`split_label`), two columns, shared axes."""
    panels: dict[str, dict[str, list]] = defaultdict(dict)
    for label, seeds in groups.items():
        head, rest = split_label(label)
        panels[head][rest] = seeds
    rests = sorted({rest for by in panels.values() for rest in by})
    color = {rest: f"C{i % 10}" for i, rest in enumerate(rests)}
    cols = min(2, len(panels))
    rows = -(-len(panels) // cols)
    fig = Figure(figsize=(5.2 * cols, 3.4 * rows + 0.4))
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, cols, sharex=True, sharey=True, squeeze=False).ravel()
    for ax, (head, by) in zip(axes, sorted(panels.items())):
        for rest, seeds in sorted(by.items()):
            draw(ax, seeds, rest or head, color[rest])
        ax.set_title(head, fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    for i, ax in enumerate(axes[:len(panels)]):   # the lowest panel of each column carries the x axis
        if i + cols >= len(panels):
            ax.xaxis.set_tick_params(labelbottom=True)
            ax.set_xlabel("step")
    for ax in axes[::cols]:
        ax.set_ylabel(metric)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folders", nargs="+", type=Path)
    ap.add_argument("--metric", default="val_auc", help="a metrics.csv column (val_auc, test_auc, ...)")
    ap.add_argument("--table", default="binary", choices=sorted(TABLES), help="which runs to place")
    ap.add_argument("--title", default="")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--panels", action="store_true", help="one panel per objective (module docstring)")
    args = ap.parse_args(argv)
    groups = curves(args.folders, args.metric, args.table)
    if not groups:
        raise SystemExit("no finished runs to plot (see the messages above)")
    (plot_panels if args.panels else plot)(groups, args.metric, args.out, args.title)
    print(f"wrote {args.out}: {', '.join(f'{k} (n={len(v)})' for k, v in sorted(groups.items()))}")
    return groups


if __name__ == "__main__":
    main()
