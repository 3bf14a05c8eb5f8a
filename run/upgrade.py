"""An older run's saved config brought to today's keys, in one step.

The code reads config keys with no fallback: every default lives in ``configs/``. A config saved
by a run made before a key existed (a checkpoint's ``config``, a run folder's
``.hydra/config.yaml``) lacks that key, so it is upgraded before anything is built from it
(``eval.py``): :func:`upgrade_config` gives each missing key of :data:`ADDED_DEFAULTS` the value
that reproduces what the old run did, and moves its ``_target_`` names into the package
(:func:`lpmetrics.run.targets.upgrade_targets`).

Checks that compare configs without building anything read the same table on flattened configs:
a resume's (:func:`lpmetrics.run.runfolder.config_differences`) and the tables' protocols
(``scripts/tables/make_tables.py``, which reads ``results.json`` configs as dicts).
"""
from __future__ import annotations

import inspect

from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from lpmetrics.run.targets import package_target, upgrade_targets

#: Config keys added after committed runs or checkpoints were made, with the value that reproduces
#: what those runs did: a config without the key counts as having this value (``make_tables.py``
#: pools such runs with new ones; a resume does not call the missing key a difference).
ADDED_DEFAULTS = {
    "trainer.eval_bn": "eval",     # BatchNorm-train evaluation option; before it: eval()
    "trainer.precision": "fp32",   # bf16 autocast option; before it: float32
    "trainer.checkpoints": True,   # checkpoint-free runs; before it: always written
    "trainer.bntrain_batch_size": 32,    # the extra BN-train test evaluation; before it, none ran
                                         # (32 is the authors' batch, the value since)
    "trainer.trust_checkpoint": False,   # unpickling old checkpoints in full; before it: never asked
    "objective.pair_layout": "masked",   # dense AUC pairs; before it: masked (objectives
                                         # without the key get it on both sides: no difference)
    "dataset.split": "paper",            # authors' split option; before it: the paper's
    "dataset.normalize": "per_channel",  # per-image option; before it: per channel
    "scheduler.stages": None,            # stage schedule option; before it: milestones
    "model.conv_impl": "stock",          # GEMM convolution option; before it: torchvision's modules
    "trainer.optimizer_impl": "eager",   # compiled optimizer step option; before it: the eager step
}


def _takes(node: DictConfig, key: str) -> bool:
    """Whether the component ``node`` builds takes ``key``: a group without ``_target_`` (trainer,
    dataset, scheduler) takes every key; a component only the arguments of its constructor (an
    added AUC option is no argument of cross-entropy, an added convolution option none of an MLP)."""
    if "_target_" not in node:
        return True
    from hydra.utils import get_object
    try:
        return key in inspect.signature(get_object(package_target(node._target_))).parameters
    except (ImportError, AttributeError, ValueError, TypeError):
        return False   # a name that no longer imports: instantiating it says so


def upgrade_config(cfg: DictConfig) -> DictConfig:
    """Give ``cfg`` (in place; returned) every key of :data:`ADDED_DEFAULTS` it lacks, where its
    group is present and takes the key, and its ``_target_`` names in the package form."""
    upgrade_targets(cfg)
    with read_write(cfg), open_dict(cfg):
        for dotted, value in ADDED_DEFAULTS.items():
            group, key = dotted.rsplit(".", 1)
            node = OmegaConf.select(cfg, group)
            if isinstance(node, DictConfig) and key not in node and _takes(node, key):
                node[key] = value
    return cfg
