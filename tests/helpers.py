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
