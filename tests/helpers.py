"""Shared test helpers."""
from __future__ import annotations

import torch


def trainer_step(model, objective, optimizer, x, y, step: int) -> torch.Tensor:
    """One optimisation step making exactly the calls train.py makes; asserts a finite loss."""
    loss = objective(model(x), y)
    assert torch.isfinite(loss)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    objective.on_step_end(step=step, model=model, optimizer=optimizer, batch=(x, y))
    return loss


def assert_graph_replays_eager(fn, batch: int, classes: int) -> None:
    """``fn(logits, labels)`` and its backward captured in a CUDA graph (after a side-stream
    warm-up); a replay on new logits and labels equals the eager call, loss and gradient."""
    from lpmetrics.objectives.common import labels_checked
    x = torch.randn(batch, classes, device="cuda", requires_grad=True)
    y = torch.randint(0, classes, (batch,), device="cuda")

    def step():
        x.grad = None
        with labels_checked():
            loss = fn(x, y)
        loss.backward()
        return loss

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        loss = step()
    with torch.no_grad():
        x.copy_(torch.randn(batch, classes, device="cuda"))
        y.copy_(torch.randint(0, classes, (batch,), device="cuda"))
    graph.replay()
    got, grad = loss.clone(), x.grad.clone()
    want = step()
    torch.testing.assert_close(got, want.detach())
    torch.testing.assert_close(grad, x.grad)
