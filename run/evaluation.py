"""One evaluation of a run: the metrics of a split, test in both BatchNorm modes.

:func:`evaluate` gives the row entries of ``metrics.csv`` for one split; the run
(:meth:`lpmetrics.run.job.Run.evaluate`) selects its best checkpoint on
:data:`PRIMARY_METRIC` of val.
"""
from __future__ import annotations

from typing import Callable

from omegaconf import DictConfig

from lpmetrics import metrics
from lpmetrics.run.builders import predict

#: the metric a run selects its best evaluation on (``val_<metric>``), per ``dataset.task``
PRIMARY_METRIC = {"binary": "auc", "multiclass": "auc_mu"}

#: key prefix of the test metrics in the BatchNorm mode other than ``trainer.eval_bn``
#: (``test_bntrain_auc`` beside ``test_auc``): the names ``eval.py --bn-mode train`` and
#: ``scripts/tables/summarize_runs.py`` give the authors' evaluation
OTHER_BN_PREFIX = {"train": "bntrain_", "eval": "bneval_"}


def evaluate(model, bundle, split: str, cfg: DictConfig, device,
             predict_fn: Callable | None = None) -> dict[str, float]:
    """Metrics of ``split`` with BatchNorm in the ``trainer.eval_bn`` mode (batches of
    ``trainer.eval_batch_size``); for ``test`` also in the other mode, under the keys
    ``bntrain_<metric>`` (batches of ``trainer.bntrain_batch_size``: the authors' evaluation,
    binary_auc.py of zihangm/nondecomposable-as-lp) or, for an ``eval_bn=train`` run,
    ``bneval_<metric>``. A run records both because it cannot recover either later without its
    checkpoints. Neither mode touches the model's running statistics, its mode or any global RNG
    (:func:`builders.predict`), so the training trajectory is the same as without the second.
    ``predict_fn`` (default :func:`builders.predict`) gives the logits: the packed launcher passes
    one that serves a whole pack's logits from one pass (:mod:`packed.evaluate`)."""
    own = cfg.trainer.eval_bn
    fn = predict_fn or predict
    out = _scored(fn, model, bundle, split, device, own, cfg.trainer.eval_batch_size)
    if split == "test":
        other = "eval" if own == "train" else "train"
        batch = cfg.trainer.bntrain_batch_size if other == "train" else cfg.trainer.eval_batch_size
        out |= {OTHER_BN_PREFIX[other] + k: v for k, v in _scored(fn, model, bundle, split, device, other, batch).items()}
    return out


def _scored(predict_fn: Callable, model, bundle, split: str, device, bn_mode: str, batch_size: int) -> dict[str, float]:
    logits, labels = predict_fn(model, getattr(bundle, split), batch_size=batch_size, device=device, bn_mode=bn_mode)
    return metrics.evaluate(labels, logits, bundle.task)
