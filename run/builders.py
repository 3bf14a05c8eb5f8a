"""Build the run's components from the composed config; shared by train.py, eval.py and scripts.

Runtime values that only the data knows (number of classes, input shape, positive ratio) are
declared ``???`` in a component's config; :func:`instantiate_runtime` fills exactly the keys a
config declares, so no caller branches on which component it builds.
"""
from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from torch import nn
from torch.utils.data import Dataset

from lpmetrics.data.stream import gather


def instantiate_runtime(cfg: DictConfig, **runtime: Any) -> Any:
    """``hydra.utils.instantiate(cfg)`` passing only the runtime keys ``cfg`` declares."""
    keys = set(cfg.keys()) if isinstance(cfg, DictConfig) else set(cfg)
    return instantiate(cfg, **{k: v for k, v in runtime.items() if k in keys})


def runtime_values(bundle) -> dict[str, Any]:
    """What a data bundle tells the model and the objective."""
    train_stats = bundle.stats["train"]
    return {
        "num_classes": bundle.num_classes,
        "input_shape": list(bundle.input_shape),
        "pos_ratio": train_stats.get("pos_fraction"),
        "class_counts": list(train_stats["class_counts"]),
    }


def build_model(cfg: DictConfig, bundle) -> nn.Module:
    return instantiate_runtime(cfg.model, **runtime_values(bundle))


class StageDecayLR(torch.optim.lr_scheduler.LRScheduler):
    r"""The authors' stage schedule: the lr is multiplied by ``gamma`` after each stage, stage
    :math:`k = 1, 2, \dots` lasting :math:`\text{first} \cdot \text{growth}^{k-1}` steps.

    ``binary_auc.py`` of zihangm/nondecomposable-as-lp: ``T_k = c * 3 ** (k - 1)`` steps at
    ``lr_k = lr0 / 3 ** (k - 1)`` with ``c = 2000``; so with ``first=2000, growth=3, gamma=1/3``
    the lr drops after steps 2,000, 8,000, 26,000, 80,000, ... (the paper instead states drops at
    2k / 10k / 25k: ``scheduler.milestones``). Like ``MultiStepLR`` it multiplies the current lr
    at each boundary, so it composes with optimizers that set their own lr.

    Example::

        >>> opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.9)
        >>> sched = StageDecayLR(opt, first=2, growth=3, gamma=1 / 3)
        >>> lrs = []
        >>> for _ in range(9):
        ...     lrs.append(round(opt.param_groups[0]["lr"], 4)); opt.step(); sched.step()
        >>> lrs   # stages of 2, 6, 18, ... steps
        [0.9, 0.9, 0.3, 0.3, 0.3, 0.3, 0.3, 0.3, 0.1]
    """

    def __init__(self, optimizer: torch.optim.Optimizer, first: int, growth: float = 3.0,
                 gamma: float = 1 / 3, last_epoch: int = -1) -> None:
        if isinstance(first, bool) or not isinstance(first, int) or first < 1:
            raise ValueError(f"scheduler.stages.first={first!r} must be an integer >= 1 (the length "
                             "of the first stage in steps; the authors' code: 2000)")
        if not (isinstance(growth, (int, float)) and growth >= 1):
            raise ValueError(f"scheduler.stages.growth={growth!r} must be a number >= 1 (each stage "
                             "is growth times the one before; the authors' code: 3)")
        self.first, self.growth, self.gamma = int(first), float(growth), float(gamma)
        super().__init__(optimizer, last_epoch)

    def stages_done(self, step: int) -> tuple[int, bool]:
        """How many stages have ended by ``step`` (lr drops so far), and whether one ended
        exactly at ``step`` (the lr drops from this step on)."""
        if self.growth == 1.0:   # equal stages: closed form (the loop would take step/first turns)
            return step // self.first, step > 0 and step % self.first == 0
        done, end, length = 0, self.first, float(self.first)
        while end <= step:
            done += 1
            if end == step:
                return done, True
            length *= self.growth
            end += int(round(length))
        return done, False

    def get_lr(self) -> list[float]:
        drop = self.stages_done(self.last_epoch)[1]
        return [g["lr"] * (self.gamma if drop else 1.0) for g in self.optimizer.param_groups]

    def _get_closed_form_lr(self) -> list[float]:
        done = self.stages_done(self.last_epoch)[0]
        return [base * self.gamma ** done for base in self.base_lrs]


def build_scheduler(cfg: DictConfig, optimizer: torch.optim.Optimizer
                    ) -> torch.optim.lr_scheduler.LRScheduler:
    """The lr schedule of ``cfg.scheduler``: step decay by ``gamma`` at ``milestones`` (the
    default, the paper's), or, when ``stages`` is set (``{first, growth}``), the authors' stage
    schedule (:class:`StageDecayLR`; then ``milestones`` must be empty)."""
    stages = cfg.get("stages")
    if stages:
        return StageDecayLR(optimizer, first=stages.get("first"), growth=stages.get("growth", 3.0),
                            gamma=cfg.gamma)
    return torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=list(cfg.milestones), gamma=cfg.gamma)


def resolve_device(name: str) -> torch.device:
    """``auto`` -> cuda when present, else cpu; a device this machine lacks raises
    :class:`validate.ConfigError` (``device=cuda`` without a GPU) before anything is built."""
    from lpmetrics.run.validate import check_device
    return check_device(name)


BN_MODES = ("eval", "train")


def autocast_dtype(cfg: DictConfig) -> torch.dtype | None:
    """The ``torch.autocast`` dtype of ``trainer.precision`` (``None`` for fp32)."""
    return {"fp32": None, "bf16": torch.bfloat16}[cfg.trainer.get("precision", "fp32")]


@torch.no_grad()
def predict(model: nn.Module, dataset: Dataset, *, batch_size: int = 512,
            device: torch.device | str = "cpu", bn_mode: str = "eval") -> tuple[np.ndarray, np.ndarray]:
    """Logits ``[N, K]`` and labels ``[N]`` of a whole dataset, in split order.

    ``bn_mode="eval"`` (default): the model in ``eval()``, BatchNorm uses its running statistics.
    ``bn_mode="train"``: BatchNorm layers normalise each evaluation batch by its own statistics,
    as the authors' public code evaluates (it never calls ``model.eval()``). The result then
    depends on ``batch_size`` and on which samples share a batch: our splits are stored sorted by
    label, which would give one-class batches, so the batches are taken in a fixed shuffled order
    (seed 0; the authors' test set is in CIFAR's original, class-mixed order) and the outputs are
    returned in split order. A batch of one sample cannot be normalised by its own statistics
    (BatchNorm raises on a 1x1 feature map), so a last batch of one joins the batch before it.
    A copy of the model runs, so the running statistics of ``model`` are left untouched, and the
    order comes from a generator of its own, so no global RNG stream moves (training after an
    evaluation in either mode is what it would have been without it).
    """
    if bn_mode not in BN_MODES:
        raise ValueError(f"bn_mode must be one of {BN_MODES}, got {bn_mode!r} "
                         "(trainer.eval_bn / eval.py --bn-mode)")
    was_training = model.training
    if bn_mode == "train":
        net = copy.deepcopy(model).eval()
        for m in net.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.train()
        order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(0))
    else:
        net = model.eval()
        order = torch.arange(len(dataset))
    batches = [idx.tolist() for idx in order.split(batch_size)]
    if bn_mode == "train" and len(batches) > 1 and len(batches[-1]) == 1:
        batches[-2:] = [batches[-2] + batches[-1]]
    logits, labels = [], []
    for idx in batches:   # gathered where the data live (the device, for train.py's runs)
        x, y = gather(dataset, torch.tensor(idx, device=getattr(dataset, "device", "cpu")))
        logits.append(net(x.to(device)).float().cpu())
        labels.append(y.cpu())
    model.train(was_training)
    back = torch.argsort(order)
    return torch.cat(logits)[back].numpy(), torch.cat(labels)[back].numpy()


def config_from_checkpoint(checkpoint: dict) -> DictConfig:
    return OmegaConf.create(checkpoint["config"])
