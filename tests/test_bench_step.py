"""``scripts.cpu.bench_step`` end to end at its smallest (one size, one round): the JSON it writes
holds every form's ratios, and the "arithmetic alone" floors lie between 0 and the form's ratio."""
import json

from scripts.cpu import bench_step


def test_bench_step_smallest(tmp_path, monkeypatch, capsys):
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
    # what oneDNN's bf16 math mode does here is recorded, and printed where it computes in float32
    modes = result["machine"]["bf16_math"]
    assert set(modes) == {"matmul", "conv"}
    assert ("compute in float32 here" in capsys.readouterr().out) == ("fp32" in modes.values())


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


def test_folded_evaluation_is_the_running_statistics_forward():
    """The ``eval`` lever times a BatchNorm-folded forward as the model's running-statistics
    evaluation: in float64, with statistics away from their initial values, the two agree to
    rounding at 32 px (``mixed``: direct and GEMM convolutions, downsampling blocks)."""
    import torch
    from torch import nn

    from lpmetrics.models.resnet import resnet18
    from scripts.cpu.bench_levers import _folded_forward

    for seed in range(3):
        torch.manual_seed(seed)
        model = resnet18(2, [3, 32, 32], conv_impl="mixed").double()
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
                m.weight.data.uniform_(0.5, 1.5)
                m.bias.data.uniform_(-0.2, 0.2)
        model.eval()
        x = torch.randn(70, 3, 32, 32, dtype=torch.float64)   # two chunks, the second partial
        with torch.no_grad():
            want, got = model(x), _folded_forward(model)(x)
        assert got.shape == want.shape == (70, 2)
        assert torch.allclose(got, want, rtol=1e-10, atol=1e-10), (seed, (got - want).abs().max().item())


def test_the_winograd_lever_computes_the_convolution():
    """The ``winograd`` lever times a convolution that is ``F.conv2d``'s (3x3, stride 1,
    padding 1) in float64, output and both gradients, on rectangular even maps."""
    import torch
    import torch.nn.functional as F

    from scripts.cpu.bench_levers import winograd_conv

    for seed, (height, width, c, cout) in enumerate([(2, 2, 3, 5), (4, 6, 7, 2), (8, 4, 16, 16)]):
        g = torch.Generator().manual_seed(seed)
        h = torch.randn(3, height, width, c, dtype=torch.float64, generator=g, requires_grad=True)
        w = torch.randn(cout, c, 3, 3, dtype=torch.float64, generator=g, requires_grad=True)
        up = torch.randn(3, height, width, cout, dtype=torch.float64, generator=g)
        want = F.conv2d(h.permute(0, 3, 1, 2), w, padding=1).permute(0, 2, 3, 1)
        got = winograd_conv(h, w)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
        for a, b in zip(torch.autograd.grad(got, (h, w), up), torch.autograd.grad(want, (h, w), up)):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
