r"""Appendix A.4 of Meng et al. (ICLR 2021 version): cosine between the active-set gradient (ours,
the default backward: :math:`z^* = \tilde A^{-1}\tilde b` differentiated on the final active set)
and the unrolled gradient (autograd through the Newton iterations, ``backward="unrolled"``), w.r.t.
the network's scores, on minibatches of a trained network's outputs.  The paper: F-score LP,
100 random batches, mean cosine 0.9991.

Both gradients come from the same loss on the same logits (float64): ``F1LPLoss`` (the paper's
case) and ``AUCLoss`` (the ``auc_lp`` objective), each with ``backward="active_set"`` and with
``backward="unrolled"``; batches are drawn without replacement from the split's logits
(a fixed permutation, seed ``--seed``).  A batch whose active-set gradient is zero (no pair or
sample on a ramp) has no cosine and is counted separately.

    DATA_ROOT=../shared/data OMP_NUM_THREADS=1 python -m scripts.solver.solver_fig_unrolled \
        --checkpoint results/lp_vs_ce_cifar10/ce_s0/best.pt --out results/solver

The checkpoint is not committed (``*.pt``); ``scripts/studies/lp_vs_ce_run.sh ce_s0 objective=ce
seed=0`` makes it (``results/lp_vs_ce_cifar10/README.md``).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch


PAPER_COSINE = 0.9991
OBJECTIVES = {"f1_lp": "lpmetrics.objectives.ratio.F1LPLoss", "auc_lp": "lpmetrics.objectives.auc.AUCLoss"}


def make_loss(name: str, backward: str):
    module, cls = OBJECTIVES[name].rsplit(".", 1)
    return getattr(__import__(module, fromlist=[cls]), cls)(backward=backward)


def gradient(loss_fn, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    x = logits.detach().double().clone().requires_grad_()
    loss = loss_fn(x, labels)
    (g,) = torch.autograd.grad(loss, x, allow_unused=True)
    return torch.zeros_like(x) if g is None else g


def cosines(logits: torch.Tensor, labels: torch.Tensor, batches: list, name: str) -> dict:
    """Per batch: cosine(active-set grad, unrolled grad) and the two losses' difference."""
    fns = [make_loss(name, b) for b in ("active_set", "unrolled")]
    cos, zero, loss_diff = [], 0, []
    for idx in batches:
        x, y = logits[idx], labels[idx]
        ga, gu = (gradient(f, x, y).flatten() for f in fns)
        with torch.no_grad():
            loss_diff.append(float(abs(fns[0](x.double(), y) - fns[1](x.double(), y))))
        if ga.norm() == 0 or gu.norm() == 0:
            zero += 1
            continue
        cos.append(float(ga @ gu / (ga.norm() * gu.norm())))
    return {"cosines": cos, "zero_gradient_batches": zero, "max_loss_diff": max(loss_diff)}


def split_logits(checkpoint: str, split: str):
    """Logits ``[N, K]`` and labels of ``split``, from a ``train.py`` checkpoint (eval.py's
    loading: the config stored in the checkpoint, the same data and model builders)."""
    from lpmetrics.run.builders import build_model, predict
    from lpmetrics.data import build_data
    from eval import load_config, open_checkpoint
    path, ckpt = open_checkpoint(None, checkpoint)
    cfg = load_config(ckpt, path.parent)
    bundle = build_data(cfg.dataset, seed=cfg.seed)
    model = build_model(cfg, bundle)
    model.load_state_dict(ckpt["model"])
    logits, labels = predict(model, getattr(bundle, split), batch_size=256)
    return torch.from_numpy(logits), torch.from_numpy(labels), ckpt.get("step")


def plot(res: dict, path: Path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(res), figsize=(5.5 * len(res), 4), squeeze=False)
    for ax, (name, r) in zip(axes[0], res.items()):
        gap = np.maximum(1 - np.array(r["cosines"]), 1e-16)     # 1 - cos, floored at 1e-16
        ax.hist(np.log10(gap), bins=np.arange(-16.5, -1, 0.5), color="C0")
        ax.axvline(np.log10(1 - PAPER_COSINE), color="C3", ls="--",
                   label=f"paper: mean cosine {PAPER_COSINE}")
        ax.set(title=f"{name}: {len(gap)} batches, mean cosine {1 - gap.mean():.6f}",
               xlabel="log10(1 - cosine)  (1e-16: equal to float64 precision)", ylabel="batches")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", required=True, help="a train.py checkpoint (best.pt)")
    ap.add_argument("--split", default="test")
    ap.add_argument("--batches", type=int, default=100)
    ap.add_argument("--batch-size", type=int, default=64, help="the study's training batch")
    ap.add_argument("--objectives", default="f1_lp,auc_lp")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="results/solver")
    args = ap.parse_args()
    torch.set_num_threads(1)
    logits, labels, step = split_logits(args.checkpoint, args.split)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(args.seed))
    if args.batches * args.batch_size > len(order):
        raise SystemExit(f"{args.batches} x {args.batch_size} > {len(order)} samples in "
                         f"{args.split}; lower --batches or --batch-size")
    batches = list(order[:args.batches * args.batch_size].split(args.batch_size))
    res = {name: cosines(logits, labels, batches, name) for name in args.objectives.split(",")}
    meta = {"checkpoint": Path(args.checkpoint).as_posix(), "step": step, "split": args.split,
            "batches": args.batches, "batch_size": args.batch_size, "seed": args.seed}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "a4_unrolled.json").write_text(json.dumps({"meta": meta, **res}, indent=1))
    plot(res, out / "a4_unrolled.png")
    lines = ["| objective | batches with a gradient | zero-gradient batches | mean cosine "
             "(1 - mean) | min cosine (1 - min) | max loss difference | paper mean |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for name, r in res.items():
        c = np.array(r["cosines"])
        lines.append(f"| {name} | {len(c)} | {r['zero_gradient_batches']} | {c.mean():.6f} "
                     f"({1 - c.mean():.1e}) | {c.min():.6f} ({1 - c.min():.1e}) | "
                     f"{r['max_loss_diff']:.1e} | {PAPER_COSINE if name == 'f1_lp' else '-'} |")
    (out / "a4_unrolled.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
