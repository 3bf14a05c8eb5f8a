"""AP as the direct-loss task loss (baselines/direct_loss_ap.py): the DP against brute force, AP
against scikit-learn, the gradient formula, and ``objective=direct_ap`` (the alias of
``direct_loss task_loss=ap``) through the trainer's calls. The other updates and the 0-1 loss:
tests/test_baselines_direct_loss.py."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from sklearn.metrics import average_precision_score

from lpmetrics.baselines.direct_loss import DirectLoss
from lpmetrics.baselines.direct_loss_ap import ap_loss_of_ranking, loss_augmented_ranking, ranking_signs
from lpmetrics.run.builders import instantiate_runtime
from tests.helpers import trainer_step


def brute_force(pos, neg, epsilon, sign, orders=False):
    """max over every interleaving of the sorted lists (or, with ``orders``, over every ordering of
    all items) of F(y) + s*eps*Delta_AP(y), computed from the definitions."""
    P, N = len(pos), len(neg)
    best, arg = -np.inf, None
    if orders:
        items = [(1, k) for k in range(P)] + [(0, k) for k in range(N)]
        candidates = itertools.permutations(items)
    else:
        candidates = (tuple((1 if r in slots else 0, None) for r in range(P + N))
                      for slots in itertools.combinations(range(P + N), P))
    for ranking in candidates:
        if orders:
            rank = {item: r for r, item in enumerate(ranking)}
            y = np.array([[1.0 if rank[(1, m)] < rank[(0, n)] else -1.0 for n in range(N)]
                          for m in range(P)])
        else:
            flags = [f for f, _ in ranking]
            above = np.array([flags[:r].count(0) for r, f in enumerate(flags) if f])
            y = ranking_signs(above, N)
        # precision at each positive, from y alone: negatives above positive m = #(y[m] == -1)
        neg_above = np.sort((y == -1).sum(1))
        prec = np.arange(1, P + 1) / (np.arange(1, P + 1) + neg_above)
        value = (y * (pos[:, None] - neg[None, :])).mean() + sign * epsilon * (1 - prec.mean())
        if value > best:
            best, arg = value, neg_above
    return best, arg


@pytest.mark.parametrize("sign", [1, -1])
@pytest.mark.parametrize("P,N", [(p, n) for p in range(1, 7) for n in range(1, 7)])
def test_dp_equals_brute_force_over_interleavings(P, N, sign):
    rng = np.random.default_rng(100 * P + N + (sign > 0))
    for epsilon in (0.05, 0.5, 3.0):  # from "rarely changes the ranking" to "dominates F"
        pos = np.sort(rng.normal(size=P))[::-1]
        neg = np.sort(rng.normal(size=N))[::-1]
        above, value = loss_augmented_ranking(pos, neg, sign * epsilon)
        best, arg = brute_force(pos, neg, epsilon, sign)
        assert value == pytest.approx(best, abs=1e-12)
        np.testing.assert_array_equal(above, arg)


@pytest.mark.parametrize("sign", [1, -1])
@pytest.mark.parametrize("P,N", [(1, 3), (2, 2), (3, 3), (2, 4)])
def test_sorted_interleavings_suffice(P, N, sign):
    """Observation 1: the max over *all* orderings is attained by a sorted interleaving."""
    rng = np.random.default_rng(7 * P + N)
    pos, neg = np.sort(rng.normal(size=P))[::-1], np.sort(rng.normal(size=N))[::-1]
    _, value = loss_augmented_ranking(pos, neg, sign * 0.7)
    best, _ = brute_force(pos, neg, 0.7, sign, orders=True)
    assert value == pytest.approx(best, abs=1e-12)


@pytest.mark.parametrize("seed", range(20))
def test_ap_loss_equals_sklearn(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 80))
    labels = (rng.random(n) < rng.uniform(0.1, 0.9)).astype(np.int64)
    labels[:2] = [0, 1]
    scores = rng.normal(size=n)
    logits = torch.tensor(np.stack([np.zeros(n), scores], 1), requires_grad=True)
    loss = DirectLoss("ap", "positive", epsilon=0.1)(logits, torch.from_numpy(labels))
    assert loss.item() == pytest.approx(1 - average_precision_score(labels, scores), abs=1e-12)


@pytest.mark.parametrize("sign", [1, -1])
def test_gradient_is_the_direct_loss_formula(sign):
    rng = np.random.default_rng(3)
    n, eps = 30, 0.2
    labels = torch.from_numpy((rng.random(n) < 0.4).astype(np.int64))
    margins = rng.normal(size=n)
    logits = torch.tensor(np.stack([np.zeros(n), margins], 1), requires_grad=True)
    update = "positive" if sign > 0 else "negative"
    DirectLoss("ap", update, epsilon=eps)(logits, labels).backward()
    pos_idx = np.where(labels.numpy() == 1)[0]
    neg_idx = np.where(labels.numpy() == 0)[0]
    pos_idx = pos_idx[np.argsort(-margins[pos_idx])]
    neg_idx = neg_idx[np.argsort(-margins[neg_idx])]
    pos, neg = margins[pos_idx], margins[neg_idx]
    above_d, _ = loss_augmented_ranking(pos, neg, sign * eps)
    y_d, y_w = ranking_signs(above_d, len(neg)), np.sign(pos[:, None] - neg[None, :])
    scale = 1.0 / (len(pos) * len(neg))
    expected = np.zeros(n)  # d F(y)/d phi_m = scale * sum_n y_mn ; d/d phi_n = -scale * sum_m y_mn
    expected[pos_idx] = scale * (y_d - y_w).sum(1)
    expected[neg_idx] = -scale * (y_d - y_w).sum(0)
    expected *= sign / eps
    grad = logits.grad.numpy()
    np.testing.assert_allclose(grad[:, 1], expected, atol=1e-12)    # margin = l1 - l0
    np.testing.assert_allclose(grad[:, 0], -expected, atol=1e-12)
    assert np.abs(expected).sum() > 0  # eps = 0.2 does change the ranking on this batch


def test_perfect_ranking_has_zero_loss():
    assert ap_loss_of_ranking(np.zeros(3, dtype=np.int64)) == 0.0


def test_smoke_training_improves_ap(compose_cfg):
    torch.manual_seed(0)
    x = torch.randn(512, 5)
    y = (x[:, 0] - x[:, 1] + 0.3 * torch.randn(512) > 0.8).long()
    model = torch.nn.Linear(5, 2)
    objective = instantiate_runtime(compose_cfg(["objective=direct_ap"]).objective,
                                    pos_ratio=0.3, num_classes=2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def full_ap():
        with torch.no_grad():
            m = model(x)
            return average_precision_score(y.numpy(), (m[:, 1] - m[:, 0]).numpy())

    start = full_ap()
    for step in range(60):
        idx = torch.randint(0, 512, (64,))
        trainer_step(model, objective, optimizer, x[idx], y[idx], step)
    assert full_ap() > max(start, 0.9)
    assert "task_loss" in objective.pop_stats()
