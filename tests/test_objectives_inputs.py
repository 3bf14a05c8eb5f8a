"""Bad inputs to the LP objectives fail like cross-entropy's do, with a message that says what to
fix: labels outside the classes, soft labels, non-finite constructor arguments, bad solver
options; half-precision logits are cast for the LP instead of failing inside the solver."""
from __future__ import annotations

import pytest
import torch

from lpmetrics.objectives.auc import AUCLoss
from lpmetrics.objectives.auc_mu import AUCMuLoss
from lpmetrics.objectives.auc_ova import AUCOneVsAllLoss
from lpmetrics.objectives.ratio import F1LPLoss, FBetaLPLoss, JaccardLPLoss, PrecisionAtRecallLPLoss

BINARY = {"auc": lambda: AUCLoss(), "f1": lambda: F1LPLoss(), "jaccard": lambda: JaccardLPLoss(),
          "prec_at_recall": lambda: PrecisionAtRecallLPLoss()}
MULTI = {"auc_ova": lambda: AUCOneVsAllLoss(num_classes=3), "auc_mu": lambda: AUCMuLoss(num_classes=3)}


def _logits(b=8, k=2, dtype=torch.float32):
    return torch.randn(b, k, generator=torch.Generator().manual_seed(0)).to(dtype).requires_grad_()


@pytest.mark.parametrize("name", sorted(BINARY))
@pytest.mark.parametrize("labels, values", [([2, 0, 1, 1, 0, 1, 0, 1], "0..2"),
                                            ([-1, 0, 1, 1, 0, 1, 0, 1], "-1..1")])
def test_binary_objectives_reject_labels_out_of_range(name, labels, values):
    with pytest.raises(ValueError, match=rf"labels must lie in 0\.\.1 \(2 classes\); got values in {values}"):
        BINARY[name]()(_logits(), torch.tensor(labels))


@pytest.mark.parametrize("name", sorted(MULTI))
def test_multiclass_objectives_reject_labels_out_of_range(name):
    with pytest.raises(ValueError, match=r"labels must lie in 0\.\.2 \(3 classes\); got values in 0\.\.3"):
        MULTI[name]()(_logits(k=3), torch.tensor([0, 1, 2, 3, 0, 1, 2, 0]))


@pytest.mark.parametrize("name", sorted(BINARY) + sorted(MULTI))
def test_soft_labels_are_refused_not_thresholded(name):
    make = {**BINARY, **MULTI}[name]
    k = 3 if name in MULTI else 2
    soft = torch.tensor([0.2, 0.9, 0.5, 1.0, 0.0, 0.7, 0.1, 0.6])
    with pytest.raises(ValueError, match=r"labels must be integer class indices \(int64\), got dtype "
                                         r"torch.float32; soft labels are not supported"):
        make()(_logits(k=k), soft)
    with pytest.raises(ValueError, match=r"labels must be \[B\] .* one-hot or soft labels are not supported"):
        make()(_logits(k=k), torch.nn.functional.one_hot(torch.arange(8) % k, k))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", sorted(BINARY) + sorted(MULTI))
def test_half_precision_logits_are_cast_for_the_lp(name, dtype):
    make = {**BINARY, **MULTI}[name]
    k = 3 if name in MULTI else 2
    logits = _logits(k=k, dtype=dtype)
    labels = torch.arange(8) % k
    loss = make()(logits, labels)
    reference = make()(logits.detach().float(), labels)
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    torch.testing.assert_close(loss, reference)
    loss.backward()
    assert logits.grad.dtype == dtype and torch.isfinite(logits.grad.float()).all()


@pytest.mark.parametrize("value", [float("inf"), float("nan"), 0.0, -0.01, "wide"])
@pytest.mark.parametrize("make", [lambda e: AUCLoss(epsilon=e),
                                  lambda e: AUCOneVsAllLoss(num_classes=3, epsilon=e),
                                  lambda e: AUCMuLoss(num_classes=3, epsilon=e)])
def test_non_finite_epsilon_is_rejected_at_construction(make, value):
    with pytest.raises(ValueError, match=r"epsilon must be a finite number > 0 \(the ramp width"):
        make(value)


def test_other_non_finite_arguments_are_rejected():
    with pytest.raises(ValueError, match="beta must be a finite number > 0; got inf"):
        FBetaLPLoss(beta=float("inf"))
    with pytest.raises(ValueError, match="recall_penalty must be a finite number >= 0; got nan"):
        PrecisionAtRecallLPLoss(recall_penalty=float("nan"))
    with pytest.raises(ValueError, match="positive_class must be 0 or 1"):
        AUCLoss(positive_class=2)
    with pytest.raises(ValueError, match="backward must be one of"):
        AUCLoss(backward="implicit")
    with pytest.raises(ValueError, match="positive_class must be 0 or 1"):
        F1LPLoss(positive_class=-1)
    with pytest.raises(ValueError, match="backward must be one of"):
        F1LPLoss(backward="implicit")


@pytest.mark.parametrize("make", [lambda s: AUCLoss(solver=s), lambda s: F1LPLoss(solver=s)])
def test_bad_solver_options_fail_at_construction(make):
    with pytest.raises(ValueError, match=r"bad solver option\(s\): tol=-1 must be a finite number > 0"):
        make({"tol": -1})
    with pytest.raises(ValueError, match=r"unknown solver option\(s\) \['tols'\]"):
        make({"tols": 1e-6})


def test_empty_batches_are_recorded_beside_degenerate_ones():
    auc = AUCLoss()
    auc(_logits(), torch.ones(8, dtype=torch.long))                  # no negative: nothing to rank
    auc(_logits(), torch.arange(8) % 2)
    assert auc.pop_stats()["empty_batches"] == 0.5
    mu = AUCMuLoss(num_classes=3)
    mu(_logits(k=3), torch.arange(8) % 2)                             # class 2 missing: degenerate
    stats = mu.pop_stats()
    assert stats["degenerate_batches"] == 1.0 and stats["empty_batches"] == 0.0
    f1 = F1LPLoss()
    f1(_logits(), torch.zeros(8, dtype=torch.long))                   # no positive: F1 undefined
    assert f1.pop_stats()["empty_batches"] == 1.0


def test_objectives_declare_tasks_and_min_batch():
    assert AUCLoss.tasks == ("binary",) and F1LPLoss.tasks == ("binary",)
    assert "multiclass" in AUCOneVsAllLoss.tasks and "multiclass" in AUCMuLoss.tasks
    assert AUCLoss.min_batch_size == 2 and F1LPLoss.min_batch_size == 2


@pytest.mark.parametrize("name", sorted(BINARY) + sorted(MULTI))
def test_a_call_under_inference_mode_does_not_break_later_training(name, monkeypatch):
    """An evaluation under ``torch.inference_mode`` first (the objective's cached constants
    made there), then a training call with its backward: the caches hold normal tensors."""
    import lpmetrics.objectives.fractional as fractional
    import lpmetrics.objectives.ratio as ratio
    monkeypatch.setattr(ratio, "_HALF_DIFF", {})
    monkeypatch.setattr(fractional, "_IDENTITIES", {})
    loss_fn = (BINARY | MULTI)[name]()
    k = 3 if name in MULTI else 2
    labels = torch.tensor([0, 1, 1, 0, 1, 0, 1, 2 if k == 3 else 1])
    with torch.inference_mode():
        loss_fn(_logits(k=k).detach(), labels)
    logits = _logits(k=k)
    loss_fn(logits, labels).backward()
    assert logits.grad is not None and torch.isfinite(logits.grad).all()
