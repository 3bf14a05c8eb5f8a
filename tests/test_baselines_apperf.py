"""objective=f1_apperf: the AP-Perf F1 layer is wired with the right sign and trains a linear model."""
from __future__ import annotations

import torch
from sklearn.metrics import f1_score

from lpmetrics.baselines.apperf import APPerfF1


def test_descent_raises_positive_margins_and_lowers_negative_ones():
    torch.manual_seed(0)
    logits = torch.zeros(32, 2)
    logits[:, 1] = 0.1 * torch.randn(32)
    logits.requires_grad_()
    labels = torch.tensor([0, 1] * 16)
    APPerfF1()(logits, labels).backward()
    g = logits.grad[:, 1] - logits.grad[:, 0]
    assert g[labels == 1].mean() < 0 < g[labels == 0].mean()


def test_training_improves_f1_of_a_linear_model():
    torch.manual_seed(0)
    x = torch.randn(512, 5)
    y = (x[:, 0] + 0.3 * torch.randn(512) > 0.8).long()  # ~22 % positives
    model = torch.nn.Linear(5, 2)
    objective = APPerfF1()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def f1_now():
        with torch.no_grad():
            return f1_score(y.numpy(), model(x).argmax(1).numpy(), zero_division=0)

    start = f1_now()
    for _ in range(40):
        idx = torch.randint(0, 512, (64,))
        loss = objective(model(x[idx]), y[idx])
        assert torch.isfinite(loss)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert f1_now() > max(start, 0.7)


def test_a_failing_projection_gives_a_counted_zero_loss(monkeypatch):
    objective = APPerfF1()

    def broken(*args):
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr(objective.layer, "forward", broken)
    logits = torch.randn(8, 2, requires_grad=True)
    loss = objective(logits, torch.tensor([0, 1] * 4))
    loss.backward()
    assert loss.item() == 0.0 and torch.count_nonzero(logits.grad) == 0
    assert objective.pop_stats()["apperf_failed_batches"] == 1.0
