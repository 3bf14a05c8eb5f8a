r"""The true (non-differentiable) set losses the learned surrogate imitates, batched over sets.

Grabocka, Scholz, Schmidt-Thieme, *Learning Surrogate Losses* (2019; ``../shared/seeds/004_*.txt``,
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
* EER: on the ROC points of every distinct threshold (``roc_curve(drop_intermediate=False)``,
  including the all-negative point), the first point of least :math:`|FNR - FPR|` in decreasing
  threshold order gives :math:`(FNR + FPR) / 2`.
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
    """Equal error rate on the ROC points of the distinct thresholds; NaN without both classes."""
    order = torch.argsort(s, dim=-1, descending=True, stable=True)
    ys = torch.gather(y.long(), -1, order)
    ss = torch.gather(s, -1, order)
    num_pos = ys.sum(-1, keepdim=True)
    num_neg = ys.shape[-1] - num_pos
    tp, fp = ys.cumsum(-1), (1 - ys).cumsum(-1)
    last_of_tie = torch.ones_like(ys, dtype=torch.bool)
    last_of_tie[..., :-1] = ss[..., :-1] != ss[..., 1:]
    zero = torch.zeros_like(tp[..., :1])
    tp, fp = torch.cat([zero, tp], -1), torch.cat([zero, fp], -1)
    valid = torch.cat([torch.ones_like(last_of_tie[..., :1]), last_of_tie], -1)
    # |FNR - FPR| * P * N in exact integers, so equal gaps tie exactly and argmin takes the first
    gap = ((num_pos - tp) * num_neg - fp * num_pos).abs()
    gap = torch.where(valid, gap, torch.full_like(gap, torch.iinfo(gap.dtype).max))
    k = gap.argmin(-1, keepdim=True)
    P, N = num_pos.double(), num_neg.double()
    fnr = 1.0 - torch.gather(tp, -1, k).double() / P.clamp_min(1)
    fpr = torch.gather(fp, -1, k).double() / N.clamp_min(1)
    out = ((fnr + fpr) / 2).squeeze(-1)
    ok = ((P > 0) & (N > 0)).squeeze(-1)
    return torch.where(ok, out, torch.full_like(out, float("nan")))


TARGETS = {"auc": one_minus_auc, "ap": one_minus_ap, "f1": one_minus_f1, "mcr": mcr,
           "jaccard": one_minus_jaccard, "mcc": one_minus_mcc, "eer": eer}


def target_loss(name: str):
    """The target loss function by name (``auc, ap, f1, mcr, jaccard, mcc, eer``)."""
    if name not in TARGETS:
        raise ValueError(f"unknown target loss {name!r}; choose one of {sorted(TARGETS)}")
    return TARGETS[name]
