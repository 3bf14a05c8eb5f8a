"""scripts/packed/bench_packed.py: FLOP counts against hand counts, the report's schema on a tiny pack,
the paper tables' run counts against their config comments, and the skip rules."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_packed", ROOT / "scripts" / "packed" / "bench_packed.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_flops_of_a_linear_layer_equal_the_hand_count(bench):
    b, d, k = 5, 7, 3
    model = nn.Linear(d, k, bias=False)
    # forward x @ W^T: 2*b*d*k; backward: grad W only (the input needs no gradient): 2*b*d*k
    assert bench.count_flops(model, torch.randn(b, d), torch.randint(0, k, (b,))) == 4 * b * d * k


def test_flops_of_conv_then_linear_equal_the_hand_count(bench):
    b, cin, cout, side, ksz, k = 4, 2, 3, 6, 3, 5
    out = side - ksz + 1
    model = nn.Sequential(nn.Conv2d(cin, cout, ksz, bias=False), nn.Flatten(),
                          nn.Linear(cout * out * out, k, bias=False))
    conv = 2 * b * cout * out * out * cin * ksz * ksz   # multiply-adds of the convolution, x2
    lin = 2 * b * cout * out * out * k
    # conv: forward + grad weight (no grad input: x is data); linear: forward + grad W + grad input
    expected = 2 * conv + 3 * lin
    x, y = torch.randn(b, cin, side, side), torch.randint(0, k, (b,))
    assert bench.count_flops(model, x, y) == expected


def test_table_run_counts_match_the_experiment_comments(bench):
    # configs/experiment/*.yaml comments: 576, 144, 180 and 108 runs
    counts = {name: bench.table_runs(name) for name in bench.TABLES}
    assert counts["table1_binary"] == {50: 144, 32: 288, 96: 144}
    assert sum(counts["table2_multiclass"].values()) == 144
    assert sum(counts["table_f1"].values()) == 180
    assert counts["table_eps"] == {50: 108}


def test_tiny_sweep_writes_the_report_schema(bench, tmp_path):
    out = tmp_path / "bench"
    report = bench.main(["--model", "mlp", "--set", "model.hidden=[8]", "--px", "8", "--n", "1", "2",
                         "--dtypes", "fp32", "--batch", "8", "--reps", "1", "--inline",
                         "--objectives", "ce", "auc_lp", "ppd_sg", "--out", str(out)])
    saved = json.loads((out / "bench.json").read_text())
    assert saved["schema"] == "bench_packed/1" and saved["machine"]["torch"] == torch.__version__
    assert len(saved["cells"]) == 6   # 2 N x 3 objectives
    assert saved["flops_gemm"] == {"8": None}   # gemm mode: torchvision ResNets only
    for row in saved["cells"]:
        assert set(row) == set(bench.CELL_KEYS) and row["status"] == "ok"
        # the pack-wide SGD update is timed beside the per-run optimizers; PPD has its own optimizer
        assert (row["sync_free_pack_ms"] is None) == (row["objective"] == "ppd_sg")
        assert row["objective_form"] == "as configured"   # capture-safe forms only on CUDA
        assert row["ratio"] == pytest.approx(row["packed_ms"] / row["separate_ms"])
        flops = int(saved["flops"]["8"])
        assert row["tflops_packed"] == pytest.approx(row["n"] * flops / row["packed_ms"] / 1e9)
        assert row["graph_ms"] is None and row["graph_status"].startswith("n/a (CPU")
        assert row["mem_packed_mb"] is not None and row["mem_separate_mb"] is not None
        # the pack forwards side by side: loop is the CPU's packed column; gemm refuses an MLP
        assert row["loop_ms"] == row["packed_ms"] and row["vmap_ms"] > 0
        assert row["gemm_ms"] is None and row["forwards_note"].startswith("gemm: n/a")
    assert [p["table"] for p in saved["projection"]] == bench.TABLES
    # the 32/50/96 px tables are projected from the only size measured (8 px) by FLOPs
    assert all(p["hours"]["packed fp32"] > 0 and p["hours"]["graph fp32"] is None
               for p in saved["projection"])
    assert "from 8px by FLOPs" in saved["projection"][0]["basis"]["packed fp32"]
    md = (out / "bench.md").read_text()
    assert "n/a (CPU)" in md and "| table1_binary |" in md
    assert report["cells"] == saved["cells"]


def test_skip_rules(bench):
    spec = dict(px=32, objective="ce", dtype="fp32", n=24, reps=3, flops=10**9, flops_of={32: 10**9})
    assert "--n 24" in bench.plan_skip(spec, [], left=1e9, explicit_n=False, on_cpu=True)
    assert bench.plan_skip(spec, [], left=1e9, explicit_n=True, on_cpu=True) == ""
    done = dict(bench.skipped({**spec, "n": 8}, ""), status="ok", packed_ms_per_run=100.0,
                separate_ms_per_run=100.0)
    assert "predicted" in bench.plan_skip(spec, [done], left=10, explicit_n=True, on_cpu=True)
    oom = bench.skipped({**spec, "n": 8}, "out of memory: CUDA out of memory")
    assert "ran out of memory" in bench.plan_skip(spec, [oom], left=1e9, explicit_n=True, on_cpu=False)
