r"""Memory of a ResNet-18 training step with the AUC LP against the batch size: the constraint
matrix :math:`A = -I` structured (``DiagonalOperator``, what ``auc_lp`` uses) against dense
(Meng et al. 2021 §5, "Dealing with large scale LPs": batch 200 in 1 GB with the sparse LP,
11 GB dense, on a 2080 Ti).

One step = ``model(x)`` -> :class:`objectives.auc.AUCLoss` -> ``backward`` -> SGD ``step``, on
random 3x32x32 images (CIFAR's shape) with 91 % positives (the LP-vs-CE study's split), the
model of ``configs/model/resnet18.yaml`` (torchvision ResNet-18, ImageNet stem, 2 classes).
``dense`` is the same loss with :meth:`~objectives.pairwise.PairwiseRampLP.solve_pairs`
overridden to pass ``-torch.eye(M)`` (:class:`DenseAUCLoss`), ``dense_paper`` the authors'
dense recipe with autograd through its 20 Newton steps (:class:`DensePaperAUCLoss`).  Each (A, batch) cell runs in a
fresh subprocess: a warm-up step, then the peak resident set of one more step above the RSS
before it (``bench_solver_measure.peak_memory_mb``: ``/proc/self/clear_refs`` reset, glibc set
to ``mmap`` big blocks), and that step's wall time.  CPU, float32, one thread.

    OMP_NUM_THREADS=1 python -m scripts.solver.solver_fig_memory --out results/solver
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

from scripts.solver.bench_solver_measure import ROOT, _mallopt, dense_paper_auc, peak_memory_mb
from scripts.solver.bench_solver_report import write_outputs

from lpmetrics.objectives.auc import AUCLoss

POSITIVES = 0.91
BATCHES = {"structured": [32, 64, 128, 200, 256, 512, 1024], "dense": [32, 64, 128, 200],
           "dense_paper": [32, 64, 128, 200]}
LOSSES = {}        # kind -> loss class, filled below


class DenseAUCLoss(AUCLoss):
    """``AUCLoss`` with the pairwise LP's ``A = -I`` materialised as a dense ``[M, M]`` tensor."""

    def solve_pairs(self, d):
        from lpmetrics.objectives.common import solve
        A = -torch.eye(d.numel(), dtype=d.dtype, device=d.device)
        return solve(torch.ones_like(d), A, d - self.epsilon, options=self.solver_options).z


class DensePaperAUCLoss(AUCLoss):
    """``AUCLoss`` through the authors' dense recipe (``bench_solver_measure.dense_paper_auc``:
    materialised ``A = [-I; -I]``, 20 Newton steps with a dense inverse, autograd through all)."""

    def solve_pairs(self, d):
        return dense_paper_auc(d, self.epsilon)


LOSSES.update(structured=AUCLoss, dense=DenseAUCLoss, dense_paper=DensePaperAUCLoss)


def pairs_of(batch):
    n_pos = min(batch - 1, max(1, round(POSITIVES * batch)))
    return n_pos * (batch - n_pos)


def step_fn(kind, batch, seed=0):
    """One training step as a closure (model, optimizer and data built here, outside it)."""
    from lpmetrics.models.resnet import resnet18
    g = torch.Generator().manual_seed(seed)
    model = resnet18(num_classes=2, input_shape=[3, 32, 32], cifar_stem=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
    loss_fn = LOSSES[kind](epsilon=0.01)
    x = torch.randn(batch, 3, 32, 32, generator=g)
    n_pos = min(batch - 1, max(1, round(POSITIVES * batch)))
    y = (torch.arange(batch) < n_pos).long()[torch.randperm(batch, generator=g)]

    def step():
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return float(loss.detach())
    return step


def worker(kind, batch):
    _mallopt(128 * 1024, 128 * 1024)         # before any allocation (see peak_memory_mb)
    torch.set_num_threads(1)
    step = step_fn(kind, batch)
    t0 = time.perf_counter()
    step()                                   # warm-up: optimizer state, lazy init
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    mb = peak_memory_mb(step, torch.device("cpu"))
    return {"kind": kind, "batch": batch, "pairs": pairs_of(batch), "peak_mib": mb,
            "step_s": time.perf_counter() - t0, "first_s": first}


def run_cell(kind, batch, timeout):
    cmd = [sys.executable, "-m", "scripts.solver.solver_fig_memory", "--worker", f"{kind},{batch}"]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"kind": kind, "batch": batch, "pairs": pairs_of(batch),
                "skipped": f"timed out (> {timeout} s)"}
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode or not lines:
        return {"kind": kind, "batch": batch, "pairs": pairs_of(batch),
                "error": (p.stderr.strip().splitlines() or ["?"])[-1][-200:]}
    return json.loads(lines[-1])


def table(rows):
    by = {(r["kind"], r["batch"]): r for r in rows}
    cell = lambda r: (f"{r['peak_mib']:.0f} MiB, {r['step_s']:.2f} s" if "peak_mib" in r  # noqa: E731
                      else r.get("skipped") or r.get("error") or "-")
    L = ["| batch | pairs (91 % positives) | structured A (DiagonalOperator) | dense A (ours) | "
         "dense paper recipe | dense / structured | paper recipe / structured |",
         "|---:|---:|---:|---:|---:|---:|---:|"]
    for b in sorted({r["batch"] for r in rows}):
        s, d, p = (by.get((k, b), {}) for k in LOSSES)
        ratio = lambda x: (f"{x['peak_mib'] / s['peak_mib']:.1f}x"  # noqa: E731
                           if "peak_mib" in s and "peak_mib" in x else "-")
        L.append(f"| {b} | {pairs_of(b)} | {cell(s)} | {cell(d)} | {cell(p)} | {ratio(d)} | "
                 f"{ratio(p)} |")
    return "\n".join(L)


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4.2))
    for i, kind in enumerate(LOSSES):
        pts = sorted((r["batch"], r["peak_mib"]) for r in rows
                     if r["kind"] == kind and "peak_mib" in r)
        if pts:
            ax.plot(*zip(*pts), marker="osD"[i], label=kind.replace("_", " "))
    ax.set(xscale="log", yscale="log", xlabel="batch size (91 % positives)",
           ylabel="peak RSS of one step above the RSS before it, MiB",
           title="ResNet-18 + AUC LP training step (CPU, float32)")
    ax.set_xscale("log", base=2)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="results/solver")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per cell")
    ap.add_argument("--kinds", default=",".join(BATCHES))
    ap.add_argument("--report-from", metavar="JSON",
                    help="add the new cells to a saved .json's rows (same kind and batch: replaced)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        kind, batch = args.worker.split(",")
        print(json.dumps(worker(kind, int(batch))), flush=True)
        return
    rows = json.loads(Path(args.report_from).read_text()) if args.report_from else []
    for kind in args.kinds.split(",") if args.kinds else []:
        for b in BATCHES[kind]:
            rows = [r for r in rows if (r["kind"], r["batch"]) != (kind, b)]
            rows.append(run_cell(kind, b, args.timeout))
            print(rows[-1], file=sys.stderr, flush=True)
    write_outputs(args.out, "memory_resnet18", rows, table(rows), lambda path: plot(rows, path))


if __name__ == "__main__":
    main()
