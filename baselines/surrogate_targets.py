r"""The true (non-differentiable) set losses the learned surrogate imitates, batched over sets.

Grabocka, Scholz, Schmidt-Thieme, *Learning Surrogate Losses* (2019,
§4.1): AUC, AP, F1, Jaccard and MCC become losses through :math:`1 - x`; the misclassification
rate (MCR) and the equal error rate (EER) are losses already.  Thresholded metrics predict
positive where :math:`\hat y \ge \tau` (``threshold``; the paper tunes :math:`\tau` per dataset).

Every function takes labels ``y`` and real scores ``s`` of shape ``[..., N]`` (a leading batch of
sets, so pre-training evaluates thousands of sets at once) and returns ``[...]``.  Conventions
follow scikit-learn, which ``tests/test_baselines_surrogate.py`` compares against:

* AUC counts ties as 1/2 (``roc_auc_score``); AP groups tied scores into one threshold
  (``average_precision_score``): :math:`AP = \frac1{|P|}\sum_{i\in P} \frac{|\{j \in P: s_j \ge
  s_i\}|}{|\{j: s_j \ge s_i\}|}`.
* F1, Jaccard and MCC are 0 where their denominator is 0 (``zero_division=0``; MCC's convention).
* EER: where the ROC, linearly interpolated between the points of consecutive distinct
  thresholds, crosses :math:`FNR = FPR` (the definition :func:`metrics.eer` evaluates, so the
  surrogate learns the loss the run is scored on).
* A set without positives or without negatives has no AUC / EER (and no AP without positives):
  those entries are NaN, and the surrogate skips them.
"""
from __future__ import annotations

import torch


def _counts(y: torch.Tensor, s: torch.Tensor, threshold: float):
    pred = s >= threshold
    yb = y.bool()
    tp = (pred & yb).sum(-1).double()
    fp = (pred & ~yb).sum(-1).double()
    fn = (~pred & yb).sum(-1).double()
    tn = (~pred & ~yb).sum(-1).double()
    return tp, fp, fn, tn


def _safe_div(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    return torch.where(den > 0, num / den.clamp_min(1e-300), torch.zeros_like(num))


def mcr(y, s, threshold: float = 0.0):
    """Misclassification rate :math:`(FP + FN) / N`."""
    tp, fp, fn, tn = _counts(y, s, threshold)
    return (fp + fn) / (tp + fp + fn + tn)


def one_minus_f1(y, s, threshold: float = 0.0):
    tp, fp, fn, _ = _counts(y, s, threshold)
    return 1.0 - _safe_div(2 * tp, 2 * tp + fp + fn)


def one_minus_jaccard(y, s, threshold: float = 0.0):
    tp, fp, fn, _ = _counts(y, s, threshold)
    return 1.0 - _safe_div(tp, tp + fp + fn)


def one_minus_mcc(y, s, threshold: float = 0.0):
    """:math:`1 - MCC` (range [0, 2]), the paper's 1 - x conversion."""
    tp, fp, fn, tn = _counts(y, s, threshold)
    den = (tp + fp) * (tp + fn) * (tn + fp) * (tn + fn)
    return 1.0 - _safe_div(tp * tn - fp * fn, den.sqrt())


def one_minus_auc(y, s, threshold: float = 0.0):
    """:math:`1 - AUC` by pairs (ties count 1/2); NaN without both classes."""
    yd = y.to(s.dtype)
    # wins_ij = [s_i > s_j] + [s_i = s_j] / 2 = (1 + sign(s_i - s_j)) / 2; sums of signs are exact
    signs = torch.sign(s.unsqueeze(-1) - s.unsqueeze(-2))
    num_pos = yd.sum(-1)
    pairs = num_pos * (yd.shape[-1] - num_pos)
    signed = (yd.unsqueeze(-2) @ signs @ (1 - yd).unsqueeze(-1)).squeeze(-1).squeeze(-1)
    auc = (0.5 * signed / pairs.clamp_min(1) + 0.5).double()
    return torch.where(pairs > 0, 1.0 - auc, torch.full_like(auc, float("nan")))


def one_minus_ap(y, s, threshold: float = 0.0):
    """:math:`1 - AP` with tied scores sharing one threshold; NaN without positives."""
    yd = y.to(s.dtype)
    above = (s.unsqueeze(-2) >= s.unsqueeze(-1)).to(s.dtype)  # [..., i, j] = s_j >= s_i
    counts = torch.stack([yd, torch.ones_like(yd)], -1)        # exact integer counts via matmul
    hits = above @ counts
    precision = (hits[..., 0] / hits[..., 1]).double()
    num_pos = yd.sum(-1).double()
    ap = (precision * yd.double()).sum(-1) / num_pos.clamp_min(1)
    return torch.where(num_pos > 0, 1.0 - ap, torch.full_like(ap, float("nan")))


def eer(y, s, threshold: float = 0.0):
    """Equal error rate where the interpolated ROC crosses FNR = FPR (:func:`metrics.eer`'s
    closed form, batched); NaN without both classes."""
    order = torch.argsort(s, dim=-1, descending=True, stable=True)
    ys = torch.gather(y.long(), -1, order)
    ss = torch.gather(s, -1, order)
    num_pos = ys.sum(-1, keepdim=True)
    num_neg = ys.shape[-1] - num_pos
    zero = torch.zeros_like(ys[..., :1])
    tp, fp = torch.cat([zero, ys.cumsum(-1)], -1), torch.cat([zero, (1 - ys).cumsum(-1)], -1)
    last_of_tie = torch.ones_like(ys, dtype=torch.bool)
    last_of_tie[..., :-1] = ss[..., :-1] != ss[..., 1:]
    valid = torch.cat([torch.ones_like(last_of_tie[..., :1]), last_of_tie], -1)  # ROC points
    # FPR + TPR >= 1 in exact integers; the first valid point past it ends the crossing segment
    past = valid & (fp * num_pos + tp * num_neg >= num_pos * num_neg)
    k = past.int().argmax(-1, keepdim=True).clamp_min(1)
    index = torch.arange(valid.shape[-1], device=s.device).expand_as(valid)
    prev_valid = torch.where(valid, index, torch.zeros_like(index)).cummax(-1).values
    k0 = torch.gather(prev_valid, -1, k - 1)   # the segment's start: the valid point before k
    P, N = num_pos.double(), num_neg.double()
    tp0, fp0 = torch.gather(tp, -1, k0).double(), torch.gather(fp, -1, k0).double()
    tp1, fp1 = torch.gather(tp, -1, k).double(), torch.gather(fp, -1, k).double()
    u = (P * N - fp0 * P - tp0 * N) / ((fp1 - fp0) * P + (tp1 - tp0) * N)
    out = ((fp0 + u * (fp1 - fp0)) / N).squeeze(-1)
    ok = ((P > 0) & (N > 0)).squeeze(-1)
    return torch.where(ok, out, torch.full_like(out, float("nan")))


TARGETS = {"auc": one_minus_auc, "ap": one_minus_ap, "f1": one_minus_f1, "mcr": mcr,
           "jaccard": one_minus_jaccard, "mcc": one_minus_mcc, "eer": eer}


def target_loss(name: str):
    """The target loss function by name (``auc, ap, f1, mcr, jaccard, mcc, eer``)."""
    if name not in TARGETS:
        raise ValueError(f"unknown target loss {name!r}; choose one of {sorted(TARGETS)}")
    return TARGETS[name]
