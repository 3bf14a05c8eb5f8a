"""scripts/solver/time_highs_overhead.py: runs on the host route and leaves solver/ as it found it."""
import importlib.util
from pathlib import Path

from lpmetrics.solver.backends import host_highs, square_active

ROOT = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("time_highs_overhead",
                                                  ROOT / "scripts" / "solver" / "time_highs_overhead.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_pieces_cover_the_call_and_the_wrappers_are_removed():
    mod = _script()
    before = {name: getattr(host_highs, name) for name in mod.STEPS}
    lu = square_active.lu_of_arrays
    c, A, b = mod.CASES["sparse"]()
    out = mod.pieces((c, A, b, None, None), repeats=2)
    assert {name: getattr(host_highs, name) for name in mod.STEPS} == before
    assert square_active.lu_of_arrays is lu
    # (two calls: each median is the mean of two, so "rest" = forward - steps cannot go below 0)
    assert all(v >= 0 for v in out.values())
    assert out["  solve_host"] > 0 and out["  certified_solution"] > 0
    assert 0 < out["    of which SuperLU"] < out["  certify"]
    first, second, threads = mod.cold_probe((c, A, b, None, None), probes=2)
    assert first > 0 and second > 0 and threads >= 1
