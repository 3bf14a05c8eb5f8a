r"""``bench_solver.py --family public``: our LP layer on public MPS instances, against HiGHS.

For each ``*.mps`` (or ``*.MPS``) file of a folder: read it (:func:`scripts.solver.netlib.mps.read_mps`),
convert it to our form ``min c^T z s.t. A z <= b, A_eq z = b_eq, z >= 0``
(:func:`scripts.solver.netlib.mps.to_standard_form`), solve the converted LP with HiGHS
(``scipy.optimize.linprog(method="highs")``, the reference) and with ``solver.solve_lp`` in
float64 -- default options (``forward="auto"``, ``max_seconds=60``), Newton alone
(``forward="newton"``) and Newton without equilibration (``equilibrate=0``) -- and report per
instance and configuration:

* solved (objective within ``1e-6`` of HiGHS, relative to ``max(1, |HiGHS|)``), refused (a
  typed ``LPSolverError``: its ``kind``) or wrong (a returned objective off by more);
* ``|obj - HiGHS| / max(1, |HiGHS|)``;
* time ratio to HiGHS (forward only, no gradient; median of up to ``repeats`` calls each, all
  in this one process, side by side);
* Newton steps (``stats["iterations"]``; HiGHS's simplex iterations where HiGHS solved it)
  and which forward answered (``stats["forward"]``: ``newton``, ``highs`` or
  ``newton+highs``).

    OMP_NUM_THREADS=1 python -m scripts.solver.bench_solver --family public \
        --mps-dir scripts/solver/netlib --out results/solver
"""
from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from scipy.optimize import linprog

from lpmetrics.solver import LPSolverError, solve_lp
from scripts.solver.netlib.mps import read_mps, to_standard_form

ACCURACY = 1e-6
# the default; Newton alone (what "auto" starts with); Newton without equilibration
CONFIGS = {"auto": {}, "newton": {"forward": "newton"},
           "newton_unscaled": {"forward": "newton", "equilibrate": 0}}
DENSE_MAX = 1_000_000              # A with more entries than this goes in as torch.sparse


def _tensors(S):
    f64 = torch.float64

    def mat(M):
        if M.shape[0] * M.shape[1] <= DENSE_MAX:
            return torch.tensor(M.toarray(), dtype=f64)
        M = M.tocoo()
        idx = torch.tensor(np.vstack([M.row, M.col]), dtype=torch.long)
        return torch.sparse_coo_tensor(idx, torch.tensor(M.data, dtype=f64), M.shape)

    has_eq = S.A_eq.shape[0] > 0
    return (torch.tensor(S.c, dtype=f64), mat(S.A), torch.tensor(S.b, dtype=f64),
            mat(S.A_eq) if has_eq else None,
            torch.tensor(S.b_eq, dtype=f64) if has_eq else None)


def _highs(S):
    has_eq = S.A_eq.shape[0] > 0
    return linprog(S.c, A_ub=S.A if S.A.shape[0] else None, b_ub=S.b if S.A.shape[0] else None,
                   A_eq=S.A_eq if has_eq else None, b_eq=S.b_eq if has_eq else None,
                   bounds=(0, None), method="highs")


def _timed(fn, repeats, budget_s):
    """Median seconds of up to ``repeats`` calls (fewer past ``budget_s``) and the last result."""
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
        if sum(times) > budget_s:
            break
    return statistics.median(times), out


def bench_instance(path, repeats=5, budget_s=3.0, options=None):
    """One MPS file: the HiGHS reference and one row per forward of :data:`FORWARDS`."""
    model = read_mps(path)
    S = to_standard_form(model)
    t_h, ref = _timed(lambda: _highs(S), repeats, budget_s)
    row = {"instance": Path(path).stem, "rows": int(model.A.shape[0]),
           "cols": int(model.A.shape[1]), "m": int(S.A.shape[0]), "p": int(S.A_eq.shape[0]),
           "n": int(S.A.shape[1]), "highs_status": int(ref.status), "highs_ms": 1e3 * t_h,
           "highs_obj": None if ref.status != 0 else float(ref.fun + S.offset),
           "highs_iterations": int(getattr(ref, "nit", 0))}
    data = _tensors(S)
    for fw, kw in CONFIGS.items():
        def call():
            try:
                with torch.no_grad():
                    return solve_lp(*data, **{**kw, **(options or {})})
            except LPSolverError as err:
                return err
        t, out = _timed(call, repeats, budget_s)
        cell = {"ms": 1e3 * t, "ratio": None if not t_h else t / t_h}
        if isinstance(out, LPSolverError):
            cell.update(status="refused", kind=out.kind, message=str(out)[:300],
                        iterations=out.stats.get("iterations"))
        else:
            obj = float(out.value) + S.offset
            err = None if row["highs_obj"] is None else \
                abs(obj - row["highs_obj"]) / max(1.0, abs(row["highs_obj"]))
            cell.update(status="solved" if err is not None and err <= ACCURACY else "wrong",
                        obj=obj, err=err, iterations=out.stats["iterations"],
                        forward=out.stats["forward"], eps_steps=out.stats["eps_steps"])
        row[fw] = cell
    return row


def run_public(mps_dir, repeats=5, budget_s=3.0, log=print):
    files = sorted(p for p in Path(mps_dir).iterdir() if p.suffix.lower() == ".mps")
    if not files:
        raise SystemExit(f"no .mps files in {mps_dir}: point --mps-dir at a folder of MPS files "
                         f"(e.g. scripts/solver/netlib).")
    rows = []
    for p in files:
        t0 = time.perf_counter()
        rows.append(bench_instance(p, repeats, budget_s))
        log(f"{p.name}: " + ", ".join(f"{fw} {rows[-1][fw]['status']}" for fw in CONFIGS)
            + f" [{time.perf_counter() - t0:.1f} s]")
    return rows


def _cell(c):
    if c["status"] == "refused":
        what = f"refused ({c['kind']})"
        err = "–"
    else:
        what = c["status"] + (f" ({c['forward']})" if c.get("forward") else "")
        err = "–" if c.get("err") is None else f"{c['err']:.1e}"
    ratio = "–" if c["ratio"] is None else f"{c['ratio']:.1f}×"
    steps = "–" if c.get("iterations") is None else str(c["iterations"])
    return [what, err, ratio, steps]


def write_public_report(rows, meta, out_dir, stem="public_lps"):
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{stem}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    head = ("| instance | rows × cols (ours: m + p, n) | HiGHS objective | HiGHS ms | default "
            "(`auto`): status | rel. error | time / HiGHS | steps | `newton`: status | "
            "rel. error | time / HiGHS | Newton steps | `newton`, `equilibrate=0`: status | "
            "rel. error | time / HiGHS | Newton steps |")
    lines = [f"# Public LPs (MPS): `solve_lp` against HiGHS", "",
             f"Command: `{meta['command']}`  ", f"Date: {meta['date']}; machine: {meta['cpu']}, "
             f"{meta['threads']} torch thread(s), load {meta['load']}; {meta['versions']}; "
             f"code {meta['code']}.", "",
             "Float64, forward only (no gradient), median of up to 5 calls per cell, HiGHS = "
             "`scipy.optimize.linprog(method='highs')` on the same converted LP in the same "
             "process. Solved = objective within 1e-6 of HiGHS relative to max(1, |HiGHS|); "
             "refused = a typed `LPSolverError` (its `kind`). Steps: Newton steps, or HiGHS's "
             "simplex iterations where the answer came from HiGHS (`highs`); "
             "`newton+highs` = Newton's steps before the hand-off plus HiGHS's.", "",
             head, "|" + "---|" * 16]
    for r in rows:
        obj = "–" if r["highs_obj"] is None else f"{r['highs_obj']:.10g}"
        lines.append("| " + " | ".join(
            [r["instance"], f"{r['rows']} × {r['cols']} ({r['m']} + {r['p']}, {r['n']})", obj,
             f"{r['highs_ms']:.2f}"] + _cell(r["auto"]) + _cell(r["newton"])
            + _cell(r["newton_unscaled"])) + " |")
    ok = {fw: sum(r[fw]["status"] in ("solved", "refused") for r in rows) for fw in CONFIGS}
    solved = {fw: sum(r[fw]["status"] == "solved" for r in rows) for fw in CONFIGS}
    names = {"auto": "Default options", "newton": "Newton alone",
             "newton_unscaled": "Newton without equilibration"}
    lines += [""] + [f"{names[fw]}: {solved[fw]} of {len(rows)} solved to 1e-6, "
                     f"{ok[fw] - solved[fw]} refused with a typed error, "
                     f"{len(rows) - ok[fw]} wrong.  " for fw in CONFIGS] + [""]
    (out_dir / f"{stem}.md").write_text("\n".join(lines))
