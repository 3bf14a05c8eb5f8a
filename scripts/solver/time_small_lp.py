"""Side-by-side timing of the small coupled LPs: F1, F-beta, Jaccard and
P@R losses at n = 64, forward + backward through ``solver.solve_lp``, float64, one CPU thread,
against HiGHS's forward alone (``scipy.optimize.linprog(method="highs")``) on the same LP.

With ``--baseline DIR`` (another checkout of this repository, e.g. a ``git worktree`` of an
older commit) the same calls run on both code bases, alternating rounds (a fresh process per
code base and round: ``objectives`` imports ``solver`` lazily, so two copies cannot share one
process), best round of each, and the ratio baseline / here is printed.  Run:

    git worktree add --detach /tmp/base HEAD~1
    OMP_NUM_THREADS=1 python -m scripts.solver.time_small_lp --baseline /tmp/base [--rounds 5]

With ``--cvxpy`` it times the F1 loss against its cvxpylayers twin
(:class:`baselines.cvxpy_lp.F1CvxpyLoss`, SCS, one job) instead: one process, the same batches,
ours and cvxpylayers alternately in every round, and prints each round's ratio and their median:

    OMP_NUM_THREADS=1 python -m scripts.solver.time_small_lp --cvxpy [--rounds 5] [--code /tmp/base]
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import scipy.sparse as sp
import torch
from scipy.optimize import linprog

ROOT = Path(__file__).resolve().parents[2]
LOSSES = {"f1": ("F1LPLoss", {}), "fbeta": ("FBetaLPLoss", {"beta": 2.0}),
          "jaccard": ("JaccardLPLoss", {}), "p@r": ("PrecisionAtRecallLPLoss", {"alpha": 0.6})}
CONFIGS = {"paper": {}, "recipe": {"phi": "softmax_st", "margin": 0.5}}


def load_ratio(root: Path):
    """``objectives.ratio`` of the checkout at ``root`` (:func:`side` starts this process with
    ``root`` first on ``PYTHONPATH``, so ``root``'s own code is found before an installed one):
    ``lpmetrics.objectives.ratio`` where ``root`` has the package, the top-level
    ``objectives.ratio`` of a checkout from before it; refuses a module from anywhere else."""
    name = "lpmetrics.objectives.ratio" if (Path(root) / "lpmetrics").is_dir() else "objectives.ratio"
    mod = importlib.import_module(name)
    if not Path(mod.__file__).resolve().is_relative_to(Path(root).resolve()):
        raise RuntimeError(f"{name} came from {mod.__file__}, not from the checkout {root}: "
                           "start this side with that checkout first on PYTHONPATH")
    return mod


def side(root: Path, args) -> dict:
    """One round on one code base, in a fresh process: {"loss/config": ms}."""
    cmd = [sys.executable, __file__, "--side", str(root), "--n", str(args.n), "--batches",
           str(args.batches), "--repeats", str(args.repeats), "--losses", args.losses]
    path = os.pathsep.join([str(root)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []))
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True,
                                     env={**os.environ, "PYTHONPATH": path}).stdout.splitlines()[-1])


def side_main(args):
    torch.set_num_threads(1)
    mod, data, out = load_ratio(args.side), batches(args.n, args.batches), {}
    for name in args.losses.split(","):
        cls, kw = LOSSES[name]
        for config, ckw in CONFIGS.items():
            out[f"{name}/{config}"] = time_loss(getattr(mod, cls)(**kw, **ckw), data,
                                                args.repeats)
    print(json.dumps(out))


def batches(n, count, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        logits = torch.randn(n, 2, generator=g, dtype=torch.float64).requires_grad_(True)
        labels = (torch.rand(n, generator=g) < 0.5).long()
        labels[0] = 1
        out.append((logits, labels))
    return out


def time_loss(loss_fn, data, repeats):
    """Median ms of one fwd+bwd over the batches (each batch ``repeats`` times)."""
    def once():
        for logits, labels in data:
            logits.grad = None
            loss_fn(logits, labels).backward()
    once()                                              # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        once()
        times.append((time.perf_counter() - t0) / len(data) * 1e3)
    return statistics.median(times)


def time_highs(ratio_mod, cls, kwargs, data, repeats):
    loss_fn = getattr(ratio_mod, cls)(**kwargs)
    args = []
    for logits, labels in data:
        phi = ratio_mod.phi_of_logits(logits.detach()).clamp(-1 + 1e-6, 1 - 1e-6)
        lp = loss_fn.build_lp(phi, labels.double())
        a = [t.detach().numpy() for t in (lp.c, lp.A, lp.b, lp.A_eq, lp.b_eq)]
        args.append((a[0], sp.csr_matrix(a[1]), a[2], sp.csr_matrix(a[3]), a[4]))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for c, A, b, E, be in args:
            linprog(c, A_ub=A, b_ub=b, A_eq=E, b_eq=be, bounds=(0, None), method="highs")
        times.append((time.perf_counter() - t0) / len(args) * 1e3)
    return statistics.median(times)


def cvxpy_main(args):
    """F1 fwd+bwd, ours and cvxpylayers alternately in one process (``--cvxpy``).

    Each round times each side in a block of ``repeats`` passes over the batches, the order of
    the two blocks alternating from round to round (ours first, then cvxpylayers first, ...), so
    both see the same machine load; a block's first pass is a warm-up after the switch and is
    not counted (a cvxpylayers call evicts the caches ours runs from: ours' first call after
    one took ~1.2-1.3x its steady time on this machine).  A round's ratio is the ratio of the
    two medians of the per-call times; the script prints every round and the median ratio."""
    torch.set_num_threads(1)
    root = (args.code or ROOT).resolve()
    here = load_ratio(root)                          # before baselines: it imports objectives
    from lpmetrics.baselines.cvxpy_lp import F1CvxpyLoss
    data = batches(args.n, args.batches)
    losses = {"ours": here.F1LPLoss(), "cvxpylayers": F1CvxpyLoss(n_jobs=1)}
    with torch.no_grad():
        gap = max(abs(float(losses["ours"](*b) - losses["cvxpylayers"](*b))) for b in data)
    print(f"F1 LP, n = {args.n}, float64, 1 thread, fwd+bwd, ours ({root}) and cvxpylayers "
          f"alternating in blocks of {args.repeats} passes over {args.batches} batches "
          f"(first pass of a block not counted), median ms per call; max |loss - cvxpylayers "
          f"loss| = {gap:.1e}")
    ratios = []
    for r in range(args.rounds):
        med = {}
        order = list(losses) if r % 2 == 0 else list(losses)[::-1]
        for name in order:
            fn, ms = losses[name], []
            for rep in range(args.repeats + 1):
                for logits, labels in data:
                    logits.grad = None
                    t0 = time.perf_counter()
                    fn(logits, labels).backward()
                    if rep:
                        ms.append((time.perf_counter() - t0) * 1e3)
            med[name] = statistics.median(ms)
        ratios.append(med["cvxpylayers"] / med["ours"])
        print(f"round {r + 1}: ours {med['ours']:.3f} ms, cvxpylayers {med['cvxpylayers']:.3f} "
              f"ms, cvxpylayers/ours {ratios[-1]:.2f}x")
    print(f"median cvxpylayers/ours over {args.rounds} rounds: {statistics.median(ratios):.2f}x")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--baseline", type=Path, help="another checkout to time side by side")
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--batches", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3, help="alternations baseline / here")
    ap.add_argument("--losses", default="f1,fbeta,jaccard,p@r")
    ap.add_argument("--cvxpy", action="store_true",
                    help="F1 only: ours vs cvxpylayers, alternating in one process")
    ap.add_argument("--code", type=Path, help="--cvxpy: time this checkout's code instead "
                    "(e.g. a git worktree of an older commit)")
    ap.add_argument("--side", type=Path, help=argparse.SUPPRESS)   # internal: one round
    args = ap.parse_args(argv)
    if args.side:
        return side_main(args)
    if args.cvxpy:
        return cvxpy_main(args)
    roots = {"here": ROOT}
    if args.baseline:
        roots["baseline"] = args.baseline.resolve()
    best = {}
    for _ in range(args.rounds):
        for key, root in roots.items():            # alternate: both see the same load
            for cell, ms in side(root, args).items():
                best[key, cell] = min(best.get((key, cell), float("inf")), ms)
    torch.set_num_threads(1)
    data, here = batches(args.n, args.batches), load_ratio(ROOT)
    print(f"n = {args.n}, float64, 1 thread, median ms of fwd+bwd per call "
          f"({args.batches} batches x {args.repeats} repeats, best of {args.rounds} rounds)")
    head = f"{'loss':8} {'config':7} {'here':>8}"
    head += f" {'baseline':>9} {'base/here':>9}" if args.baseline else ""
    print(head + f" {'HiGHS fwd':>9} {'HiGHS/here':>10}")
    for name in args.losses.split(","):
        cls, kw = LOSSES[name]
        for config, ckw in CONFIGS.items():
            ms = best["here", f"{name}/{config}"]
            hi = time_highs(here, cls, kw, data, args.repeats)
            row = f"{name:8} {config:7} {ms:8.3f}"
            if args.baseline:
                base = best["baseline", f"{name}/{config}"]
                row += f" {base:9.3f} {base / ms:8.1f}x"
            print(row + f" {hi:9.3f} {hi / ms:9.2f}x")


if __name__ == "__main__":
    main()
