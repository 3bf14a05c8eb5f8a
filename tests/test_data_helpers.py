"""Helpers of the data tests (no tests here): dataset configs from configs/dataset/*.yaml, data root."""
from __future__ import annotations

import os
from pathlib import Path

from omegaconf import OmegaConf

CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "dataset"


def dataset_cfg(name: str, **overrides) -> dict:
    """``configs/dataset/<name>.yaml`` without its defaults list, overrides merged, resolved."""
    cfg = OmegaConf.load(CONFIGS / f"{name}.yaml")
    cfg.pop("defaults", None)
    cfg = OmegaConf.merge(cfg, overrides)
    return OmegaConf.to_container(cfg, resolve=True)


def shared_data_root() -> Path:
    """``$DATA_ROOT`` if set, else the project's ``../shared/data``."""
    env = os.environ.get("DATA_ROOT")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "shared" / "data"
