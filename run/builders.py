"""Build the run's components from the composed config; shared by the run, eval.py and scripts.

Runtime values that only the data knows (number of classes, input shape, positive ratio) are
declared ``???`` in a component's config; :func:`instantiate_runtime` fills exactly the keys a
config declares, so no caller branches on which component it builds. :func:`built` names the
config group when a constructor refuses its arguments, :func:`resolve_device` refuses a device
this machine lacks (both a :class:`~lpmetrics.errors.ConfigError`), and :func:`predict` gives the
logits a run is evaluated on.
"""
from __future__ import annotations

import copy
from typing import Any, Callable

import numpy as np
import torch
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from torch import nn
from torch.utils.data import Dataset

from lpmetrics.data.stream import gather
from lpmetrics.errors import ConfigError
from lpmetrics.models import conv_select


def instantiate_runtime(cfg: DictConfig, **runtime: Any) -> Any:
    """``hydra.utils.instantiate(cfg)`` passing only the runtime keys ``cfg`` declares."""
    keys = set(cfg.keys()) if isinstance(cfg, DictConfig) else set(cfg)
    return instantiate(cfg, **{k: v for k, v in runtime.items() if k in keys})


def built(key: str, cfg: DictConfig, make: Callable[[], Any]) -> Any:
    """``make()``, turning Hydra's wrapped constructor error into a :class:`~lpmetrics.errors.ConfigError`
    naming the config group (``objective.epsilon=inf`` -> "objective could not be built ...")."""
    try:
        return make()
    except InstantiationException as err:
        cause = err.__cause__ if err.__cause__ is not None else err
        target = OmegaConf.select(cfg, f"{key}._target_")
        raise ConfigError(f"{key} could not be built from the config ({key}._target_={target}): "
                          f"{type(cause).__name__}: {cause}") from err


def runtime_values(bundle) -> dict[str, Any]:
    """What a data bundle tells the model and the objective."""
    train_stats = bundle.stats["train"]
    return {
        "num_classes": bundle.num_classes,
        "input_shape": list(bundle.input_shape),
        "pos_ratio": train_stats.get("pos_fraction"),
        "class_counts": list(train_stats["class_counts"]),
    }


def conv_path(cfg: DictConfig, bundle, device: torch.device | None = None) -> dict | None:
    """The convolution path of the run's model (``model.conv_impl``; ``None`` for a model without
    the key, e.g. ``model=mlp``): ``impl`` (``stock``, ``gemm``, ``mixed`` or ``mixed16``, what :func:`build_model`
    builds), ``requested``, ``precision``, ``why`` and the machine (CPU model, SIMD flags, torch,
    threads). ``auto`` is this machine's choice (:func:`lpmetrics.models.conv_select.resolve`:
    gated, timed, cached; stock off the CPU); it never changes ``trainer.precision``."""
    requested = cfg.model.get("conv_impl") if "conv_impl" in cfg.model else None
    if requested is None:
        return None
    precision = cfg.trainer.precision
    if requested != "auto":
        note = conv_select.bf16_note(requested) if precision == "bf16" else ""
        note = f"; {note}: this path's convolutions compute in float32" if note else ""
        return {"impl": requested, "requested": requested, "precision": precision,
                "why": f"model.conv_impl={requested}{note}", **conv_select.machine()}
    device = device if device is not None else resolve_device(cfg.device)
    runtime = runtime_values(bundle)
    record = conv_select.resolve(lambda impl: instantiate_runtime(cfg.model, **runtime, conv_impl=impl),
                                 tuple(runtime["input_shape"]), runtime["num_classes"], cfg.trainer.batch_size,
                                 precision, device, stem="cifar" if cfg.model.get("cifar_stem") else "imagenet")
    return {**record, "requested": "auto"}


def build_model(cfg: DictConfig, bundle, device: torch.device | None = None) -> nn.Module:
    """The run's model; ``model.conv_impl=auto`` resolved for ``device`` (default: ``cfg.device``)
    by :func:`conv_path`."""
    path = conv_path(cfg, bundle, device)
    return instantiate_runtime(cfg.model, **runtime_values(bundle), **({"conv_impl": path["impl"]} if path else {}))


def resolve_device(name: str) -> torch.device:
    """``torch.device(name)`` (``auto``: cuda when present), or a :class:`~lpmetrics.errors.ConfigError`
    when the device does not exist on this machine (``device=cuda`` without a GPU), before anything
    is built."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError) as err:
        raise ConfigError(f"device={name!r} is not a device name ({err}); use device=auto, cpu, "
                          "cuda or cuda:N") from None
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ConfigError(f"device={name} but this machine has no usable CUDA GPU "
                              "(torch.cuda.is_available() is False); use device=auto or device=cpu")
        if device.index is not None and device.index >= count:
            raise ConfigError(f"device={name} but this machine has {count} GPU(s) "
                              f"(cuda:0..cuda:{count - 1}); pick one of them or device=auto")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"device={name} but MPS is not available here; use device=auto or cpu")
    return device


BN_MODES = ("eval", "train")


def autocast_dtype(cfg: DictConfig) -> torch.dtype | None:
    """The ``torch.autocast`` dtype of ``trainer.precision`` (``None`` for fp32)."""
    return {"fp32": None, "bf16": torch.bfloat16}[cfg.trainer.precision]


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
