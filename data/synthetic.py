r"""Synthetic data of Song et al. 2016 (direct loss minimization for AP), §4.1.

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

Linear teacher (App. 5.3, ``teacher="linear"``): "20,000 data points by sampling from a 10
dimensional standard Gaussian distribution. The data points with a sum of numbers in all
dimensions being larger than 0 are assigned to the positive class [...] To produce the non-linearly
separable dataset, we randomly flip 20% of the binary labels." The score is :math:`\sum_k x_k`;
``pos_fraction=None`` labels by its sign (the paper's rule, about 50 % positive), a number by the
top fraction as above. ``label_noise`` flips exactly ``round(label_noise * n)`` labels, drawn from
their own stream, of the whole set (train and test alike, as the paper flips "the binary labels"
before the split), with either teacher. ``label_noise=0`` leaves the data bit-identical. With the
linear teacher, ``hidden`` only shapes the student: ``[]`` (``dataset=synthetic_linear``) gives
App. 5.3's :math:`\phi(x, w) = w^\top x` (plus a bias).

Student: "To ensure that we don't suffer from model misspecification we employ the same network
structure" (§4.1). ``configs/model/synthetic_student.yaml`` (what ``dataset=synthetic`` picks)
reads its hidden widths from ``dataset.source.hidden``, the key that builds the teacher here, so
the trained MLP has the teacher's layer shapes (:func:`random_teacher`) with a 2-logit head.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from lpmetrics.data.source import SourceData

TEACHERS = ("relu", "linear")


def random_teacher(rng: np.random.Generator, dim: int, hidden: Sequence[int]) -> list[tuple[np.ndarray, np.ndarray]]:
    """The teacher's ``(W [in, out], b [out])`` per weight layer, all i.i.d. N(0, 1): ``len(hidden)``
    ReLU layers and a final ``[hidden[-1], 1]`` score layer, drawn layer by layer (W, then b)."""
    layers, width_in = [], dim
    for width in [*hidden, 1]:
        layers.append((rng.standard_normal((width_in, int(width))), rng.standard_normal(int(width))))
        width_in = int(width)
    return layers


def teacher_data(n: int = 20_000, dim: int = 10, hidden: Sequence[int] = (100, 100, 100),
                 pos_fraction: float | None = 0.2, seed: int = 0, teacher: str = "relu",
                 label_noise: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """``(x [n, dim] float64, y [n] int64)`` labelled by a teacher's top scores (or, with
    ``pos_fraction=None``, by the sign of its score), then ``label_noise`` of them flipped."""
    if teacher not in TEACHERS:
        raise ValueError(f"teacher={teacher!r} must be one of {TEACHERS} (relu: Song et al. §4.1, "
                         "linear: App. 5.3)")
    if pos_fraction is not None and not 0.0 < pos_fraction < 1.0:
        raise ValueError(f"pos_fraction={pos_fraction} must be in (0, 1), or null (sign of the score)")
    if not 0.0 <= label_noise < 1.0:
        raise ValueError(f"label_noise={label_noise} must be in [0, 1), e.g. 0.2 (App. 5.3)")
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, dim))
    score = relu_teacher_scores(rng, x, hidden) if teacher == "relu" else x.sum(1)
    y = np.zeros(n, dtype=np.int64)
    if pos_fraction is None:
        y[score > 0] = 1
    else:
        y[np.argsort(-score, kind="stable")[: int(round(pos_fraction * n))]] = 1
    flip = np.random.default_rng([seed, 2]).permutation(n)[: int(round(label_noise * n))]
    y[flip] = 1 - y[flip]
    return x, y


def relu_teacher_scores(rng: np.random.Generator, x: np.ndarray, hidden: Sequence[int]) -> np.ndarray:
    """Scores ``[n]`` of a :func:`random_teacher` drawn from ``rng`` (after ``x``)."""
    *relu_layers, (w_out, b_out) = random_teacher(rng, x.shape[1], hidden)
    h = x
    for w, b in relu_layers:
        h = np.maximum(h @ w + b, 0.0)
    return (h @ w_out + b_out)[:, 0]


def synthetic(root=None, download: bool = False, cache_dir=None, n: int = 20_000, n_test: int = 10_000,
              dim: int = 10, hidden: Sequence[int] = (100, 100, 100), pos_fraction: float | None = 0.2,
              seed: int = 0, teacher: str = "relu", label_noise: float = 0.0) -> SourceData:
    """Train/test split (``n - n_test`` / ``n_test``) of :func:`teacher_data`; ``root``,
    ``download`` and ``cache_dir`` are accepted and unused (nothing is read from disk).
    Inputs are already standard Gaussian, so no standardisation (mean 0, std 1)."""
    if not 0 < n_test < n:
        raise ValueError(f"n_test={n_test} must be in (0, n={n})")
    x, y = teacher_data(n, dim, tuple(hidden), pos_fraction, seed, teacher, label_noise)
    perm = np.random.default_rng([seed, 1]).permutation(n)
    tr, te = np.sort(perm[n_test:]), np.sort(perm[:n_test])
    return SourceData(x[tr], y[tr], x[te], y[te], num_classes=2, kind="tabular",
                      class_names=["negative", "positive"], origin=f"synthetic {teacher} teacher seed={seed}"
                      + (f" label_noise={label_noise}" if label_noise else ""))
