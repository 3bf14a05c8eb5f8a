"""The protocol as the papers state it: the synthetic student, and checkpoints that scripts read."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from torch import nn

from lpmetrics.data import build_data
from lpmetrics.data.source import SourceData
from lpmetrics.data.synthetic import random_teacher
from lpmetrics.run import loop
from lpmetrics.run.builders import build_model

ROOT = Path(__file__).resolve().parents[1]
SMALL_SYNTHETIC = ["dataset.source.n=600", "dataset.source.n_test=200", "dataset.val_size=100"]


def linear_shapes(model: nn.Module) -> list[tuple[int, int]]:
    return [(m.in_features, m.out_features) for m in model.modules() if isinstance(m, nn.Linear)]


def test_synthetic_student_has_the_teachers_layer_widths(compose_cfg):
    """Song et al. 2016 §4.1: "we employ the same network structure" as the teacher."""
    cfg = compose_cfg(["dataset=synthetic", *SMALL_SYNTHETIC])
    src = cfg.dataset.source
    teacher = [w.shape for w, _ in random_teacher(np.random.default_rng(0), src.dim, list(src.hidden))]
    student = linear_shapes(build_model(cfg, build_data(cfg.dataset, seed=0)))
    assert student[:-1] == teacher[:-1]                        # every hidden layer, input included
    assert student[-1] == (teacher[-1][0], 2)                  # 2 logits where the teacher has 1 score
    assert len(student) == 4                                   # "a 4-layer neural network"


def test_synthetic_student_follows_the_teacher_widths_key(compose_cfg):
    cfg = compose_cfg(["dataset=synthetic", "dataset.source.hidden=[7,5]", *SMALL_SYNTHETIC])
    shapes = linear_shapes(build_model(cfg, build_data(cfg.dataset, seed=0)))
    assert shapes == [(10, 7), (7, 5), (5, 2)]


def test_misspecified_student_is_an_option(compose_cfg):
    cfg = compose_cfg(["dataset=synthetic", "model=mlp", *SMALL_SYNTHETIC])
    hidden = [out for _, out in linear_shapes(build_model(cfg, build_data(cfg.dataset, seed=0)))[:-1]]
    assert hidden == [256, 256] != list(cfg.dataset.source.hidden)


# --- scripts/solver/nmf_heatmaps.py reads train.py checkpoints ------------------------------------------

spec = importlib.util.spec_from_file_location("nmf_heatmaps", ROOT / "scripts" / "solver" / "nmf_heatmaps.py")
nmf_heatmaps = importlib.util.module_from_spec(spec)
spec.loader.exec_module(nmf_heatmaps)


def tiny_images(root=None, download=False, cache_dir=None, n: int = 60, size: int = 16) -> SourceData:
    """A 10-class RGB source of random 16x16 images in place of CIFAR-10 (no pack needed)."""
    rng = np.random.default_rng(0)
    x = lambda m: rng.integers(0, 256, (m, 3, size, size), dtype=np.uint8)  # noqa: E731
    y = lambda m: np.arange(m) % 10  # noqa: E731
    return SourceData(x(n), y(n), x(20), y(20), num_classes=10, mean=(0.5,) * 3, std=(0.25,) * 3)


TINY_RUN = ["dataset=cifar10", "dataset.source._target_=tests.test_protocol.tiny_images",
            "dataset.val_size=10", "dataset.augment=false", "device=cpu", "trainer.max_steps=2",
            "trainer.eval_every=2", "trainer.batch_size=8", "trainer.eval_batch_size=32"]


@pytest.mark.parametrize("task,classes", [("binary", 2), ("multiclass", 3)])
def test_nmf_heatmaps_loads_a_train_py_checkpoint(compose_cfg, tmp_path, task, classes):
    loop.train(compose_cfg([*TINY_RUN, f"dataset.task={task}"]), tmp_path)
    ckpt = torch.load(tmp_path / "last.pt", map_location="cpu", weights_only=False)
    net = nmf_heatmaps.load_network(str(tmp_path / "last.pt"), size=16)
    assert net.fc.out_features == classes
    for key, value in ckpt["model"].items():
        assert torch.equal(net.state_dict()[key], value), key
    images = np.random.default_rng(1).integers(0, 256, (2, 16, 16, 3), dtype=np.uint8)
    acts = nmf_heatmaps.activations(images, net, size=32, stage="layer1")
    assert acts.shape == (2, 64, 8, 8) and torch.isfinite(acts).all()
    maps = nmf_heatmaps.factor(acts[0], channels=3, ranks=[1], method="highs", penalty=10.0)
    assert maps[1][0].shape == (1, 8, 8)


def test_nmf_heatmaps_keeps_the_runs_stem_and_reads_bare_state_dicts(compose_cfg, tmp_path):
    cfg = compose_cfg(["dataset=cifar10", "model.cifar_stem=true"])
    net = nmf_heatmaps.resnet18(num_classes=2, input_shape=[3, 32, 32], cifar_stem=True)
    torch.save({"step": 1, "model": net.state_dict(), "config": OmegaConf.to_container(cfg, resolve=True)},
               tmp_path / "best.pt")
    torch.save(net.state_dict(), tmp_path / "bare.pt")
    for name in ("best.pt", "bare.pt"):
        loaded = nmf_heatmaps.load_network(str(tmp_path / name))
        assert isinstance(loaded.maxpool, nn.Identity) and loaded.conv1.kernel_size == (3, 3), name


def test_nmf_heatmaps_rejects_a_non_resnet_checkpoint(compose_cfg, tmp_path):
    torch.save({"model": nn.Linear(64, 2).state_dict(), "config": {}}, tmp_path / "mlp.pt")
    with pytest.raises(ValueError, match="model=resnet18"):
        nmf_heatmaps.load_network(str(tmp_path / "mlp.pt"))
