r"""Synthetic data of Song et al. 2016 (direct loss minimization for AP), seed 003 §4.1.

"We generate synthetic data by randomly drawing the parameters of a 4-layer neural network with
activations being rectified linear units [...] normal distribution with zero mean and unit
variance. We generate 20,000 input data points x_i from a 10 dimensional standard Gaussian. We
compute the score of each sample x_i and sort them in descending order. The top 20% of the
samples are assigned to the positive set. We then randomly divide the generated data into a
training set containing 10,000 elements and a test set containing the rest."

Teacher: :math:`s(x) = w_4^\top \mathrm{relu}(W_3\,\mathrm{relu}(W_2\,\mathrm{relu}(W_1 x + b_1)
+ b_2) + b_3) + b_4`, all weights and biases i.i.d. :math:`N(0, 1)` ("4-layer" read as four weight
layers; the hidden widths are not in the paper: ``hidden=(100, 100, 100)`` by default). Exactly
``round(pos_fraction * n)`` samples with the highest scores are positive (label 1), the rest
negative (0). Everything is drawn from ``numpy.random.default_rng(seed)``, so a ``seed`` fixes the
data for every run and method; the run seed only changes the val hold-out (build_data).

Student: "To ensure that we don't suffer from model misspecification we employ the same network
structure" (§4.1). ``configs/model/synthetic_student.yaml`` (what ``dataset=synthetic`` picks)
reads its hidden widths from ``dataset.source.hidden``, the key that builds the teacher here, so
the trained MLP has the teacher's layer shapes (:func:`random_teacher`) with a 2-logit head.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from data.source import SourceData


def random_teacher(rng: np.random.Generator, dim: int, hidden: Sequence[int]) -> list[tuple[np.ndarray, np.ndarray]]:
    """The teacher's ``(W [in, out], b [out])`` per weight layer, all i.i.d. N(0, 1): ``len(hidden)``
    ReLU layers and a final ``[hidden[-1], 1]`` score layer, drawn layer by layer (W, then b)."""
    layers, width_in = [], dim
    for width in [*hidden, 1]:
        layers.append((rng.standard_normal((width_in, int(width))), rng.standard_normal(int(width))))
        width_in = int(width)
    return layers


def teacher_data(n: int = 20_000, dim: int = 10, hidden: Sequence[int] = (100, 100, 100),
                 pos_fraction: float = 0.2, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``(x [n, dim] float64, y [n] int64)`` labelled by a random ReLU teacher's top scores."""
    if not 0.0 < pos_fraction < 1.0:
        raise ValueError(f"pos_fraction={pos_fraction} must be in (0, 1)")
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, dim))
    *relu_layers, (w_out, b_out) = random_teacher(rng, dim, hidden)
    h = x
    for w, b in relu_layers:
        h = np.maximum(h @ w + b, 0.0)
    score = (h @ w_out + b_out)[:, 0]
    y = np.zeros(n, dtype=np.int64)
    y[np.argsort(-score, kind="stable")[: int(round(pos_fraction * n))]] = 1
    return x, y


def synthetic(root=None, download: bool = False, cache_dir=None, n: int = 20_000, n_test: int = 10_000,
              dim: int = 10, hidden: Sequence[int] = (100, 100, 100), pos_fraction: float = 0.2,
              seed: int = 0) -> SourceData:
    """Train/test split (``n - n_test`` / ``n_test``) of :func:`teacher_data`; ``root``,
    ``download`` and ``cache_dir`` are accepted and unused (nothing is read from disk).
    Inputs are already standard Gaussian, so no standardisation (mean 0, std 1)."""
    if not 0 < n_test < n:
        raise ValueError(f"n_test={n_test} must be in (0, n={n})")
    x, y = teacher_data(n, dim, tuple(hidden), pos_fraction, seed)
    perm = np.random.default_rng([seed, 1]).permutation(n)
    tr, te = np.sort(perm[n_test:]), np.sort(perm[:n_test])
    return SourceData(x[tr], y[tr], x[te], y[te], num_classes=2, kind="tabular",
                      class_names=["negative", "positive"], origin=f"synthetic teacher seed={seed}")
