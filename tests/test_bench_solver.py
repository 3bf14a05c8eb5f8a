"""scripts/solver/bench_solver.py on its smallest size: every method runs, the report is written and our
solver matches HiGHS (relative objective error <= 1e-6, float64 and float32)."""
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_solver", ROOT / "scripts" / "solver" / "bench_solver.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_solver_smallest_size(bench, tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "TIMING_BUDGET_S", 0.2)   # a smoke test, not a measurement
    monkeypatch.setattr(bench, "MAX_CALLS", 5)
    R = bench.run_benchmark([32], [32], dtype="float32", in_process=True, log=lambda s: None)
    for key, res in R.items():
        assert "error" not in res, (key, res)
    for problem, positives in (("auc", "balanced"), ("auc", "91%"), ("f1", "-")):
        acc = R[(problem, positives, 32, "accuracy")]
        assert acc["float64"]["err"] <= 1e-6 and acc["float32"]["err"] <= 1e-6, acc
        assert R[(problem, positives, 32, "ours")]["median_ms"] > 0
    meta = {**bench.machine_info(), "dtype": "float32", "device": "cpu", "cap_s": 30.0,
            "date": "test", "command": "pytest"}
    bench.write_report(R, meta, tmp_path, "bench")
    table = (tmp_path / "bench.md").read_text()
    assert "| balanced | 32 | 256 |" in table and "## (b) F1 LP" in table
    assert "objective error of ours vs HiGHS <= 1e-6 everywhere (float32)" in table
    assert (tmp_path / "bench.png").stat().st_size > 0
