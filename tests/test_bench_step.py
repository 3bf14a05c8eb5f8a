"""``scripts.cpu.bench_step`` end to end at its smallest (one size, one round): the JSON it writes
holds every form's ratios, and the "arithmetic alone" floors lie between 0 and the form's ratio."""
import json

from scripts.cpu import bench_step


def test_bench_step_smallest(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    out = tmp_path / "bench.json"
    bench_step.main(["--sizes", "16", "--batch", "4", "--rounds", "1", "--eval-rounds", "1",
                     "--eval-images", "8", "--out", str(out)])
    result = json.loads(out.read_text())
    assert result["lane_paused"] == 0
    forms = result["sizes"][0]["forms"]
    assert set(forms) == set(bench_step.FORMS)
    assert forms["stock"]["step_ratio"] == 1.0
    for form, r in forms.items():
        assert 0 < r["arith_share"] <= 1 and 0 < r["eval_arith_share"] <= 1, form
        assert 0 < r["arith_floor"] <= r["step_ratio"] and 0 < r["eval_arith_floor"] <= r["eval_ratio"], form
        assert any(op.startswith("aten::mm") or "convolution" in op for op, _, _ in r["top_ops"]), form


def test_bench_levers_prints_each_lever(capsys):
    from scripts.cpu import bench_levers
    bench_levers.main(["gemm", "--rounds", "1"])
    line = capsys.readouterr().out.strip()
    assert line.startswith("gemm 4096x576 @ 576x64: fp32 ") and "bf16 math mode" in line and "bf16 tensors" in line
    try:
        bench_levers.main(["nonsense"])
    except SystemExit as exc:
        assert exc.code == 2
    else:
        raise AssertionError("an unknown lever must be refused")
