"""Song et al. 2016's synthetic experiments (§4.1 Fig. 3, App. 5.3 Figs. 4-5): nine
methods, test AP and accuracy against iterations, step size by grid search on *training* AP.

    python -m scripts.studies.song_synthetic --figure-steps fig4=300,10 fig5=300,10   # results/song_synthetic/
    python -m scripts.studies.song_synthetic --figures fig3 --iters 200 --seeds 1 --out /tmp/song  # a quick look

Protocol (what the paper states / what we chose):

* data: ``dataset=synthetic`` (Fig. 3: random 4-layer ReLU teacher, top 20 % positive),
  ``dataset=synthetic_linear`` (Fig. 4: sign of sum x) and the same with
  ``dataset.source.label_noise=0.2`` (Fig. 5); 10k train / 10k test, no validation split (the
  paper selects on training AP). The student is the teacher's structure (linear for Figs. 4-5).
* methods: ``objective=direct_loss`` with task_loss x update (the eight of §4.1) and ``ce``
  ("logistic"), built from ``configs/objective/*.yaml`` exactly as ``train.py`` builds them and
  called through the same ``objective(logits, labels)`` interface.
* per method: each step size of ``--lrs`` (times each ``--epsilons`` for the positive / negative
  updates) trained once (seed 0); the setting with the best final training AP (paper: "determined
  via grid search to produce the best AP on the training set") is then trained with seeds
  ``1..--seeds`` (init and batch order; the data are fixed).
* not in the paper (our choices): SGD with momentum 0.9, no weight decay, minibatch ``--batch-size``
  (the task loss is per minibatch), ``--iters`` iterations, the hinge's margin = 1 from the
  objective config. The figures' iteration count is not in the text.

A small dedicated loop instead of ``train.py``: thousands of tiny steps per run, where train.py's
per-run folder, checkpoint and evaluation machinery would dominate. Each finished run is cached
as one CSV under ``--out/runs/``, so an interrupted study resumes where it stopped.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

ROOT = Path(__file__).resolve().parents[2]

from lpmetrics.run.builders import instantiate_runtime
from lpmetrics.metrics import average_precision
from lpmetrics.models.mlp import MLP

FIGURES = {   # figure -> dataset overrides
    "fig3": ["dataset=synthetic"],
    "fig4": ["dataset=synthetic_linear"],
    "fig5": ["dataset=synthetic_linear", "dataset.source.label_noise=0.2"],
}
TITLES = {"fig3": "Fig. 3: nonlinear (ReLU teacher, 20 % positive)",
          "fig4": "Fig. 4: linear, no noise", "fig5": "Fig. 5: linear, 20 % label noise"}
UPDATE_NAMES = {"positive": "pos", "negative": "neg", "hinge": "hinge", "perceptron": "per"}
METHODS = {"logistic": ["objective=ce"]} | {
    f"{short}-{'AP' if task == 'ap' else '01'}":
        ["objective=direct_loss", f"objective.task_loss={task}", f"objective.update={update}"]
    for task in ("ap", "zero_one") for update, short in UPDATE_NAMES.items()}


def composed(overrides: list[str]):
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


def load_data(figure: str):
    cfg = composed(FIGURES[figure])
    src = instantiate(cfg.dataset.source)
    as_t = lambda a: torch.as_tensor(a, dtype=torch.float32)  # noqa: E731
    return (as_t(src.x_train), torch.as_tensor(src.y_train), as_t(src.x_test),
            torch.as_tensor(src.y_test), list(cfg.dataset.source.hidden))


def evaluate(model, x, y, pos_rate: float) -> dict[str, float]:
    """AP of the margin; accuracy at margin 0 (the 0-1 task's prediction) and, because AP is
    blind to a shift of the scores (an AP-trained net need not put its boundary at 0), accuracy
    when the top ``pos_rate`` (the training prior) of the scores are called positive."""
    with torch.no_grad():
        logits = model(x)
    margin = (logits[:, 1] - logits[:, 0]).numpy()
    labels = y.numpy() == 1
    top = np.zeros(len(margin), dtype=bool)
    top[np.argsort(-margin, kind="stable")[: int(round(pos_rate * len(margin)))]] = True
    return {"ap": average_precision(labels.astype(np.int64), margin),
            "acc": float(np.mean((margin >= 0) == labels)), "acc_prior": float(np.mean(top == labels))}


def train_one(data, method: str, lr: float, eps: float | None, seed: int, args) -> pd.DataFrame:
    """One run; rows every ``--eval-every`` iterations (and at 0)."""
    x_tr, y_tr, x_te, y_te, hidden = data
    torch.manual_seed(seed)
    model = MLP(num_classes=2, input_shape=[x_tr.shape[1]], hidden=hidden)
    overrides = METHODS[method] + ([f"objective.epsilon={eps}"] if eps is not None else [])
    objective = instantiate_runtime(composed(overrides).objective, num_classes=2,
                                    pos_ratio=float(y_tr.float().mean()))
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    batches = torch.Generator().manual_seed(seed)
    rows, prior = [], float(y_tr.float().mean())
    for step in range(args.iters + 1):
        if step % args.eval_every == 0:
            row = {"step": step}
            for split, (x, y) in {"train": (x_tr, y_tr), "test": (x_te, y_te)}.items():
                row |= {f"{split}_{k}": v for k, v in evaluate(model, x, y, prior).items()}
            rows.append(row)
            if not np.isfinite(row["train_ap"]):
                break
        if step == args.iters:
            break
        idx = torch.randint(0, len(x_tr), (args.batch_size,), generator=batches)
        loss = objective(model(x_tr[idx]), y_tr[idx])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if not all(torch.isfinite(p).all() for p in model.parameters()):
            rows.append({"step": step + 1, "train_ap": np.nan, "test_ap": np.nan})   # diverged
            break
    return pd.DataFrame(rows)


def is_direct(method: str) -> bool:
    """The positive / negative updates: the only ones with an epsilon."""
    return method.startswith(("pos-", "neg-"))


def run_cached(figure, data, method, lr, eps, seed, args) -> pd.DataFrame:
    tag = f"_eps{eps:g}" if eps is not None else ""
    key = f"{figure}_{method}_lr{lr:g}{tag}_s{seed}_it{args.iters}_e{args.eval_every}_b{args.batch_size}"
    path = args.out / "runs" / f"{key}.csv"
    if path.exists():
        return pd.read_csv(path)
    t0 = time.time()
    df = train_one(data, method, lr, eps, seed, args)
    df.insert(0, "figure", figure), df.insert(1, "method", method)
    df.insert(2, "lr", lr), df.insert(3, "eps", eps), df.insert(4, "seed", seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(path, index=False)
    last = df.iloc[-1]
    print(f"{key}: train AP {last.train_ap:.4f} test AP {last.test_ap:.4f} acc {last.test_acc:.4f} "
          f"({time.time() - t0:.1f} s)", flush=True)
    return df


def study(figure: str, args) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Grid (seed 0) then the chosen step size with seeds 1..args.seeds, for every method."""
    data = load_data(figure)
    args = argparse.Namespace(**vars(args))
    steps = dict(item.split("=") for item in args.figure_steps).get(figure)
    if steps:
        args.iters, args.eval_every = (int(v) for v in (steps.split(",") + [args.eval_every])[:2])
    grid_rows, curves = [], []
    for method in args.methods:
        finals = {}
        for lr in args.lrs:
            for eps in (args.epsilons if is_direct(method) else [None]):
                last = run_cached(figure, data, method, lr, eps, 0, args).iloc[-1]
                ok = last.step == args.iters and np.isfinite(last.train_ap)
                finals[lr, eps] = last.train_ap if ok else -np.inf
                grid_rows.append(dict(figure=figure, method=method, lr=lr, eps=eps,
                                      final_train_ap=last.train_ap, final_test_ap=last.test_ap,
                                      diverged=not ok))
        if args.grid_only:
            continue
        best = max(finals, key=finals.get)
        for seed in range(1, args.seeds + 1):
            curves.append(run_cached(figure, data, method, *best, seed, args))
    if args.grid_only:
        return pd.DataFrame(grid_rows), pd.DataFrame()
    return pd.DataFrame(grid_rows), pd.concat(curves, ignore_index=True)


def plot(figure: str, curves: pd.DataFrame, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    keys = ("test_ap", "test_acc", "test_acc_prior")
    fig, axes = plt.subplots(1, 3, figsize=(17, 4.8))
    for (method, df), color in zip(curves.groupby("method", sort=False),
                                   plt.cm.tab10(np.linspace(0, 1, 10))):
        style = "-" if method.endswith("AP") else ("--" if method.endswith("01") else ":")
        for ax, key in zip(axes, keys):
            by_step = df.groupby("step")[key]
            mean, lo, hi = by_step.mean(), by_step.min(), by_step.max()
            eps = f", eps {df.eps.iloc[0]:g}" if pd.notna(df.eps.iloc[0]) else ""
            ax.plot(mean.index, mean.values, style, color=color,
                    label=f"{method} (lr {df.lr.iloc[0]:g}{eps})")
            ax.fill_between(mean.index, lo.values, hi.values, color=color, alpha=0.15)
    # zoom on the part after the first quarter of training: on the easy linear data every
    # method is near 1 within a few evaluations and the random-init start would hide the gaps
    late = curves[curves.step >= curves.step.max() / 4]
    for ax, key in zip(axes, keys):
        low = late.groupby(["method", "step"])[key].mean().min()
        ax.set_ylim(max(0.0, low - 0.02 * (1 - low) - 0.002), 1.0 + 0.02 * (1 - low) + 0.0005)
    for ax, name in zip(axes, ("test AP", "test accuracy (margin > 0)",
                               "test accuracy (top train-prior fraction positive)")):
        ax.set_xlabel("iteration")
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7, ncol=2)
    n_seeds = curves.seed.nunique()
    fig.suptitle(f"{TITLES[figure]} -- mean over {n_seeds} seeds, band = min..max")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def table(curves: pd.DataFrame) -> pd.DataFrame:
    """Per figure and method: final test AP / accuracies (mean, std and n over seeds), final
    training AP, and the mean test AP over all evaluations (how fast the curve rises)."""
    keys = ["figure", "method"]
    last = curves[curves.step == curves.groupby("figure").step.transform("max")]
    area = curves.groupby(keys + ["seed"], sort=False).test_ap.mean().rename("curve_ap").reset_index()
    agg = last.merge(area, on=keys + ["seed"]).groupby(keys, sort=False).agg(
        lr=("lr", "first"), eps=("eps", "first"), iters=("step", "max"),
        test_ap=("test_ap", "mean"), test_ap_std=("test_ap", "std"),
        test_acc=("test_acc", "mean"), test_acc_std=("test_acc", "std"),
        test_acc_prior=("test_acc_prior", "mean"), test_acc_prior_std=("test_acc_prior", "std"),
        train_ap=("train_ap", "mean"), curve_ap=("curve_ap", "mean"), seeds=("seed", "nunique"))
    return agg.reset_index()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--figures", nargs="+", default=list(FIGURES), choices=list(FIGURES))
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    p.add_argument("--lrs", nargs="+", type=float, default=[0.003, 0.03, 0.3])
    p.add_argument("--epsilons", nargs="+", type=float, default=[0.1, 1.0],
                   help="grid of objective.epsilon for the positive / negative updates")
    p.add_argument("--grid-only", action="store_true", help="run the step-size grid only")
    p.add_argument("--seeds", type=int, default=3, help="final runs use seeds 1..N (the grid: seed 0)")
    p.add_argument("--iters", type=int, default=800)
    p.add_argument("--figure-steps", nargs="*", default=[], metavar="FIG=ITERS[,EVAL_EVERY]",
                   help="per-figure --iters and --eval-every, e.g. fig4=300,10")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--eval-every", type=int, default=50)
    p.add_argument("--out", type=Path, default=ROOT / "results" / "song_synthetic")
    args = p.parse_args()
    torch.set_num_threads(1)
    grids, all_curves = [], []
    for figure in args.figures:   # outputs rewritten after each figure: a cut-short study keeps them
        grid, curves = study(figure, args)
        if args.grid_only:
            continue
        grids.append(grid)
        all_curves.append(curves)
        plot(figure, curves, args.out / f"{figure}.png")
        pd.concat(grids).to_csv(args.out / "grid.csv", index=False, float_format="%.4f")
        summary = table(pd.concat(all_curves))
        summary.to_csv(args.out / "table.csv", index=False, float_format="%.4f")
        print(summary.to_string(index=False, float_format=lambda v: f"{v:.4f}"), flush=True)


if __name__ == "__main__":
    main()
