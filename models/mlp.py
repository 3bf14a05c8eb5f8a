"""A small MLP for flat features (digits, the synthetic teacher data, svmlight files)."""
from __future__ import annotations

import math
from collections.abc import Sequence

from torch import nn


class MLP(nn.Sequential):
    """``Flatten -> [Linear -> ReLU -> Dropout] * len(hidden) -> Linear(num_classes)``."""

    def __init__(self, num_classes: int, input_shape: Sequence[int],
                 hidden: Sequence[int] = (256, 256), dropout: float = 0.0) -> None:
        layers: list[nn.Module] = [nn.Flatten()]
        width = math.prod(int(s) for s in input_shape)
        for h in hidden:
            layers += [nn.Linear(width, int(h)), nn.ReLU()]
            if dropout > 0:
                layers.append(nn.Dropout(dropout))
            width = int(h)
        layers.append(nn.Linear(width, num_classes))
        super().__init__(*layers)
