"""Shared fixtures: Hydra compose for the project's configs, the packed-data root."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"

torch.set_num_threads(max(1, min(2, torch.get_num_threads())))

# model.conv_impl=auto caches its per-machine choice; the suite's tiny shapes and gates must not
# land in the user's cache (~/.cache/lpmetrics), nor a cached choice from there decide a test.
# Subprocesses inherit it (train.py, the lane's trainings).
if "LPMETRICS_CACHE" not in os.environ:
    import tempfile
    os.environ["LPMETRICS_CACHE"] = tempfile.mkdtemp(prefix="lpmetrics_test_cache_")


def shared_data_root() -> Path | None:
    """Packed datasets: $DATA_ROOT, else ../shared/data beside the checkout; None if absent."""
    for candidate in (os.environ.get("DATA_ROOT"), ROOT.parent / "shared" / "data"):
        if candidate and (Path(candidate) / "cifar10.npz").exists():
            return Path(candidate)
    return None


@pytest.fixture
def data_root() -> Path:
    root = shared_data_root()
    if root is None:
        pytest.skip("packed datasets not found (set DATA_ROOT or provide ../shared/data)")
    return root


@pytest.fixture
def compose_cfg():
    """``compose_cfg(["objective=ce", ...])`` -> the composed DictConfig."""

    def _compose(overrides=()):
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
            return compose(config_name="config", overrides=list(overrides))

    yield _compose
    GlobalHydra.instance().clear()


@pytest.fixture
def float64_default():
    """Make float64 the default dtype for one test (oracle tests), then restore it."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


@pytest.fixture
def direct_conv_weights():
    """``run(model, x)``: the weight shapes ``model`` hands to ``F.conv2d`` in one forward of ``x``,
    in call order (which convolutions a ``model.conv_impl=mixed`` model runs direct)."""
    def run(model, x):
        called = []

        class Watch(torch.overrides.TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                if func is F.conv2d:
                    called.append(tuple(args[1].shape))
                return func(*args, **(kwargs or {}))

        with Watch():
            model(x)
        return called
    return run
