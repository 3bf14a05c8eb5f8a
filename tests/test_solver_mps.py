"""``scripts/solver/netlib/mps.py``: the reader against netlib's published optima (through HiGHS on the model as
read and on our standard form), bounds/ranges/free variables in the conversion, malformed
files naming their line, and the public benchmark's smoke run."""
import importlib.util
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from scipy.optimize import linprog

from lpmetrics.solver import LPSolverError, MPSFormatError, solve_lp
from scripts.solver.netlib.mps import read_mps, to_standard_form

ROOT = Path(__file__).resolve().parents[1]
NETLIB = ROOT / "scripts" / "solver" / "netlib"
# netlib's published optimal values (https://www.netlib.org/lp/data/readme)
OPTIMA = {"afiro": -4.6475314286e02, "sc50a": -6.4575077059e01, "sc50b": -7.0e01,
          "kb2": -1.7499001299e03, "blend": -3.0812149846e01, "share2b": -4.1573224074e02,
          "stocfor1": -4.1131976219e04}


def _highs_standard(S):
    has_eq = S.A_eq.shape[0] > 0
    res = linprog(S.c, A_ub=S.A, b_ub=S.b, A_eq=S.A_eq if has_eq else None,
                  b_eq=S.b_eq if has_eq else None, method="highs")
    return res


def _highs_model(M):
    eq = M.row_lo == M.row_hi
    up, dn = np.isfinite(M.row_hi) & ~eq, np.isfinite(M.row_lo) & ~eq
    A_ub = sp.vstack([M.A[up], -M.A[dn]])
    b_ub = np.r_[M.row_hi[up], -M.row_lo[dn]]
    bounds = [(None if np.isinf(lo) else lo, None if np.isinf(hi) else hi)
              for lo, hi in zip(M.lo, M.hi)]
    return linprog(M.c, A_ub=A_ub if A_ub.shape[0] else None, b_ub=b_ub if A_ub.shape[0] else None,
                   A_eq=M.A[eq] if eq.any() else None, b_eq=M.row_lo[eq] if eq.any() else None,
                   bounds=bounds, method="highs")


@pytest.mark.parametrize("name", sorted(OPTIMA))
def test_netlib_optimum_through_both_forms(name):
    M = read_mps(NETLIB / f"{name}.mps")
    S = to_standard_form(M)
    direct, std = _highs_model(M), _highs_standard(S)
    assert direct.status == 0 and std.status == 0
    for v in (direct.fun + M.offset, std.fun + S.offset):
        assert abs(v - OPTIMA[name]) <= 1e-9 * max(1.0, abs(OPTIMA[name]))
    x = S.x(std.x)                      # back to the model's variables: feasible there
    assert np.all(x >= M.lo - 1e-7) and np.all(x <= M.hi + 1e-7)
    Ax = M.A @ x
    assert np.all(Ax >= M.row_lo - 1e-6) and np.all(Ax <= M.row_hi + 1e-6)


@pytest.mark.parametrize("name", ["afiro", "sc50b", "share2b"])
def test_solve_lp_default_options_reach_netlib_optimum(name):
    S = to_standard_form(read_mps(NETLIB / f"{name}.mps"))
    t = lambda a: torch.tensor(a, dtype=torch.float64)   # noqa: E731
    sol = solve_lp(t(S.c), t(S.A.toarray()), t(S.b), t(S.A_eq.toarray()), t(S.b_eq))
    v = float(sol.value) + S.offset
    assert abs(v - OPTIMA[name]) <= 1e-6 * max(1.0, abs(OPTIMA[name]))


BOUNDED = """\
* every bound and row type the conversion handles
NAME          TINY
OBJSENSE
    MAX
ROWS
 N  obj
 L  lim
 G  low
 E  bal
 E  rng
COLUMNS
    x         obj       1.0        lim       1.0
    x         bal       1.0
    y         obj       2.0        lim       1.0
    y         low       1.0        rng       1.0
    f         obj       -1.0       bal       -1.0
    m         obj       0.5        low       1.0
    k         obj       3.0        lim       1.0
RHS
    RHS       obj       -10.0
    RHS       lim       4.0        low       -1.0
    RHS       bal       0.5        rng       1.0
RANGES
    RNG       rng       2.0
BOUNDS
 UP BND       x         3.0
 LO BND       y         -1.0
 UP BND       y         2.5
 FR BND       f
 MI BND       m
 UP BND       m         1.0
 FX BND       k         0.25
ENDATA
"""


def test_bounds_ranges_free_and_fixed_variables(tmp_path):
    path = tmp_path / "tiny.mps"
    path.write_text(BOUNDED)
    M = read_mps(path)
    assert M.name == "TINY" and M.A.shape == (4, 5)
    assert np.isinf(M.lo[2]) and np.isinf(M.hi[2])                   # f free
    assert np.isinf(M.lo[3]) and M.hi[3] == 1.0                      # m in (-inf, 1]
    assert M.lo[4] == M.hi[4] == 0.25                                # k fixed
    assert M.row_lo[3] == 1.0 and M.row_hi[3] == 3.0                 # E row, range +2
    S = to_standard_form(M)
    ref, std = _highs_model(M), _highs_standard(S)
    assert ref.status == 0 and std.status == 0
    assert abs((ref.fun + M.offset) - (std.fun + S.offset)) <= 1e-9
    t = lambda a: torch.tensor(a, dtype=torch.float64)   # noqa: E731
    for forward in ("auto", "newton", "highs"):
        sol = solve_lp(t(S.c), t(S.A.toarray()), t(S.b), t(S.A_eq.toarray()), t(S.b_eq),
                       forward=forward)
        assert abs(float(sol.value) + S.offset - (std.fun + S.offset)) <= 1e-8


def test_fixed_format_names_with_spaces(tmp_path):
    text = ("NAME          FIXED\nROWS\n N  COST\n L  LIM 1\nCOLUMNS\n"
            "    X ONE     COST              -1.0   LIM 1              1.0\n"
            "RHS\n    RHS       LIM 1              2.0\nENDATA\n")
    path = tmp_path / "fixed.mps"
    path.write_text(text)
    M = read_mps(path, fmt="fixed")
    assert M.col_names == ["X ONE"] and M.row_names == ["LIM 1"]
    assert M.row_hi[0] == 2.0 and M.c[0] == -1.0


@pytest.mark.parametrize("body, line, message", [
    ("ROWS\n N  obj\n Q  bad\n", 4, "ROWS line"),
    ("ROWS\n N  obj\n L  r\nCOLUMNS\n    x  r  abc\n", 6, "not a number"),
    ("ROWS\n N  obj\n L  r\nCOLUMNS\n    x  s  1.0\n", 6, "not declared"),
    ("ROWS\n N  obj\n L  r\nCOLUMNS\n    x  r  1.0\nBOUNDS\n XX BND x 1.0\n", 8,
     "unknown bound type"),
    ("ROWS\n N  obj\n L  r\nCOLUMNS\n    x  r  1.0\n", 7, "no ENDATA"),
    ("ROWS\n N  obj\nFOO\n", 4, "unknown section"),
])
def test_malformed_file_names_the_line(tmp_path, body, line, message):
    path = tmp_path / "bad.mps"
    path.write_text("NAME BAD\n" + body + ("ENDATA\n" if "ENDATA" not in message else ""))
    with pytest.raises(MPSFormatError, match=message) as err:
        read_mps(path)
    assert err.value.line == line and f"line {line}" in str(err.value)
    assert isinstance(err.value, LPSolverError) and isinstance(err.value, ValueError)


def test_infeasible_and_unbounded_mps_raise_typed_errors(tmp_path):
    infeasible = ("NAME INF\nROWS\n N obj\n L a\n G b\nCOLUMNS\n    x obj 1.0 a 1.0\n"
                  "    x b 1.0\nRHS\n    RHS a 1.0 b 2.0\nENDATA\n")
    unbounded = ("NAME UNB\nROWS\n N obj\n G a\nCOLUMNS\n    x obj -1.0 a 1.0\n"
                 "RHS\n    RHS a 1.0\nENDATA\n")
    t = lambda a: torch.tensor(a, dtype=torch.float64)   # noqa: E731
    for text, kind in ((infeasible, "infeasible"), (unbounded, "unbounded")):
        path = tmp_path / f"{kind}.mps"
        path.write_text(text)
        S = to_standard_form(read_mps(path))
        for forward in ("auto", "newton", "highs"):
            with pytest.raises(LPSolverError) as err:
                solve_lp(t(S.c), t(S.A.toarray()), t(S.b), forward=forward)
            assert err.value.kind == kind, (forward, err.value)


def test_public_benchmark_smoke(tmp_path):
    spec = importlib.util.spec_from_file_location(
        "bench_solver_public", ROOT / "scripts" / "solver" / "bench_solver_public.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    folder = tmp_path / "lps"
    folder.mkdir()
    (folder / "afiro.mps").write_text((NETLIB / "afiro.mps").read_text())
    rows = bench.run_public(folder, repeats=1, log=lambda s: None)
    assert all(rows[0][k]["status"] == "solved" for k in bench.CONFIGS)
    meta = {"command": "pytest", "date": "test", "cpu": "cpu", "threads": 1, "load": "0",
            "versions": "", "code": "test"}
    bench.write_public_report(rows, meta, tmp_path)
    assert "afiro" in (tmp_path / "public_lps.md").read_text()
