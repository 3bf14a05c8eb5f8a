"""``scripts.cpu.bench_optimizers`` at its smallest (one round): one line per optimizer, SGD's
ratio 1, and each step really moves the parameters it times."""
import pytest
import torch

from scripts.cpu import bench_optimizers


def test_bench_optimizers_smallest(capsys):
    assert bench_optimizers.main(["--rounds", "1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("ResNet-18 (11.2M parameters), one thread, median of 1 steps:")
    rows = {ln.split()[0]: ln for ln in out.splitlines()[1:]}
    assert set(rows) == set(bench_optimizers.OPTIMIZERS) and "1.00x sgd" in rows["sgd"]


def test_each_timed_optimizer_moves_the_weights():
    for cls, kw in bench_optimizers.OPTIMIZERS.values():
        w = torch.nn.Parameter(torch.ones(4))
        w.grad = torch.full((4,), 0.5)
        opt = cls([w], **kw)
        opt.step()
        assert (w.detach() < 1).all()


@pytest.mark.slow
def test_bench_optimizers_compiled(capsys):
    """``--compiled`` at its smallest: each optimizer's compiled step (the run option's) beside its
    eager one, a rounding-sized difference after one step (compiles ResNet-18-sized loops: ~1 min)."""
    assert bench_optimizers.main(["--rounds", "1", "--compiled"]) == 0
    out = capsys.readouterr().out
    rows = [ln for ln in out.splitlines() if "compiled in" in ln]
    assert len(rows) == len(bench_optimizers.OPTIMIZERS)
    for row in rows:
        assert float(row.split("step ")[-1].rstrip(")")) < 1e-5, row
