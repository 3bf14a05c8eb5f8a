"""``scripts.cpu.bench_layers`` at its smallest: one row per distinct convolution of ResNet-18,
both ways timed, and its "rule" column is what ``model.conv_impl=mixed`` really runs (the
convolutions a mixed model hands to ``F.conv2d``)."""
import re

import torch

from lpmetrics.models.resnet import resnet18
from scripts.cpu import bench_layers


def test_bench_layers_rows_and_rule(capsys, direct_conv_weights):
    assert bench_layers.main(["--px", "32", "--batch", "2", "--rounds", "1"]) == 0
    rows = [ln.split("|")[1:-1] for ln in capsys.readouterr().out.splitlines() if re.match(r"\| (conv1|layer)", ln)]
    assert len(rows) == 11   # stem, 3x3 (stride 1 and 2) and 1x1 downsampling per stage
    assert all(float(v) > 0 for r in rows for v in r[3:7])
    rule = {r[0].strip(): r[8].strip() for r in rows}

    model = resnet18(2, [3, 32, 32], conv_impl="mixed")
    shapes = direct_conv_weights(model, torch.randn(2, 3, 32, 32))
    modules = dict(model.named_modules())
    direct = {tuple(modules[name].weight.shape) for name, way in rule.items() if way == "direct"}
    assert set(shapes) == direct and direct
