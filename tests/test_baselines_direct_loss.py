"""The eight direct-loss / hinge / perceptron updates of Song et al. 2016 against brute force:
every output (all rankings, all labellings) of a tiny batch is enumerated, the argmaxes of F and
of F + c * Delta are taken from the definitions, and the objective's autograd gradient must equal
the update's difference of F gradients. Also: config errors, degenerate batches, the config
alias, and a smoke run of all eight through train.py on the synthetic teacher."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from hydra.errors import InstantiationException

from lpmetrics.baselines.direct_loss import TASK_LOSSES, UPDATES, DirectLoss
from lpmetrics.errors import ConfigError
from lpmetrics.run import loop
from lpmetrics.run.builders import instantiate_runtime

SMALL_SYNTHETIC = ["dataset.source.n=600", "dataset.source.n_test=200", "dataset.val_size=100"]


def ap_outputs(labels):
    """Every ranking of the batch as (pairwise signs y [P, N] in index order, Delta_AP)."""
    pos, neg = np.where(labels == 1)[0], np.where(labels == 0)[0]
    for order in itertools.permutations(range(len(labels))):
        rank = np.empty(len(labels), dtype=int)
        rank[list(order)] = np.arange(len(labels))
        y = np.where(rank[pos][:, None] < rank[neg][None, :], 1.0, -1.0)
        hits = np.cumsum(labels[list(order)] == 1)
        at_pos = [hits[r] / (r + 1) for r in range(len(labels)) if labels[order[r]] == 1]
        yield y, 1.0 - float(np.mean(at_pos))


def ap_F_grad(y, labels):
    """d F(y) / d phi: +mean over row for a positive, -mean over column for a negative."""
    pos, neg = np.where(labels == 1)[0], np.where(labels == 0)[0]
    g = np.zeros(len(labels))
    g[pos] = y.sum(1) / y.size
    g[neg] = -y.sum(0) / y.size
    return g


def ap_F(y, phi, labels):
    pos, neg = np.where(labels == 1)[0], np.where(labels == 0)[0]
    return float((y * (phi[pos][:, None] - phi[neg][None, :])).mean())


def zero_one_outputs(labels):
    truth = np.where(labels == 1, 1.0, -1.0)
    for y in itertools.product((-1.0, 1.0), repeat=len(labels)):
        y = np.array(y)
        yield y, float(np.mean(y != truth))


def zero_one_F(y, phi, labels):
    return float(np.mean(y * phi))


def zero_one_F_grad(y, labels):
    return y / len(y)


BRUTE = {"ap": (ap_outputs, ap_F, ap_F_grad), "zero_one": (zero_one_outputs, zero_one_F, zero_one_F_grad)}


def brute_force_gradient(task_loss, update, phi, labels, epsilon, margin):
    """The update's gradient d/d phi from enumerated outputs and the definitions alone."""
    outputs, F, F_grad = BRUTE[task_loss]
    candidates = list(outputs(labels))

    def argmax(coef):
        return max(candidates, key=lambda c: F(c[0], phi, labels) + coef * c[1])[0]

    truth = min(candidates, key=lambda c: (c[1], -F(c[0], phi, labels)))[0] if task_loss == "zero_one" \
        else np.ones((int(labels.sum()), int((labels == 0).sum())))
    predicted = argmax(0.0)
    if update in ("positive", "negative"):
        s = 1.0 if update == "positive" else -1.0
        return s / epsilon * (F_grad(argmax(s * epsilon), labels) - F_grad(predicted, labels))
    if update == "hinge":
        return F_grad(argmax(margin), labels) - F_grad(truth, labels)
    return F_grad(predicted, labels) - F_grad(truth, labels)


def objective_gradient(obj, phi, labels):
    logits = torch.tensor(np.stack([np.zeros_like(phi), phi], 1), requires_grad=True)
    obj(logits, torch.from_numpy(labels)).backward()
    g = logits.grad.numpy()
    np.testing.assert_allclose(g[:, 0], -g[:, 1], atol=1e-14)   # phi = l1 - l0
    return g[:, 1]


@pytest.mark.parametrize("update", UPDATES)
@pytest.mark.parametrize("task_loss", sorted(TASK_LOSSES))
def test_gradient_equals_brute_force_enumeration(task_loss, update):
    rng = np.random.default_rng(sum(map(ord, task_loss + update)))
    nonzero = 0
    for trial in range(40):
        B = int(rng.integers(2, 7))                # 6! rankings / 2^6 labellings at most
        labels = (rng.random(B) < 0.5).astype(np.int64)
        labels[:2] = [1, 0]                        # both classes: AP is defined
        phi = rng.normal(scale=rng.choice([0.1, 1.0]), size=B)
        epsilon, margin = float(rng.choice([0.05, 0.5, 2.0])), float(rng.choice([0.3, 1.0]))
        obj = DirectLoss(task_loss, update, epsilon=epsilon, margin=margin)
        expected = brute_force_gradient(task_loss, update, phi, labels, epsilon, margin)
        np.testing.assert_allclose(objective_gradient(obj, phi, labels), expected, atol=1e-12,
                                   err_msg=f"trial {trial}: phi={phi}, labels={labels}, eps={epsilon}")
        nonzero += bool(np.abs(expected).sum() > 0)
    assert nonzero >= 5      # the trials exercise updates that move the scores


@pytest.mark.parametrize("task_loss", sorted(TASK_LOSSES))
def test_loss_value_is_the_task_loss_of_the_prediction(task_loss):
    from sklearn.metrics import average_precision_score
    rng = np.random.default_rng(5)
    for _ in range(10):
        labels = (rng.random(40) < 0.3).astype(np.int64)
        labels[:2] = [1, 0]
        phi = rng.normal(size=40)
        logits = torch.tensor(np.stack([np.zeros(40), phi], 1))
        value = DirectLoss(task_loss, "hinge")(logits, torch.from_numpy(labels)).item()
        expected = 1 - average_precision_score(labels, phi) if task_loss == "ap" \
            else np.mean((phi >= 0) != (labels == 1))
        assert value == pytest.approx(expected, abs=1e-12)


def test_direct_update_tends_to_the_loss_gradient_direction():
    """Theorem 1 in the one case with a closed form: for the 0-1 loss the positive and negative
    updates are one-sided finite differences of the expected error under a score shift; on many
    samples both point, per sample, where moving phi lowers the error (sign check)."""
    rng = np.random.default_rng(0)
    phi = rng.normal(scale=0.05, size=400)
    labels = (rng.random(400) < 0.5).astype(np.int64)
    for update in ("positive", "negative"):
        g = objective_gradient(DirectLoss("zero_one", update, epsilon=0.2), phi, labels)
        moved = g != 0
        assert moved.any()
        # gradient descent raises phi of positives and lowers it for negatives
        assert np.all(np.sign(-g[moved]) == np.where(labels[moved] == 1, 1, -1))


def test_bad_names_fail_naming_the_allowed_values():
    with pytest.raises(ConfigError, match="positive, negative, hinge, perceptron"):
        DirectLoss("ap", "structured")
    with pytest.raises(ConfigError, match="ap, zero_one"):
        DirectLoss("hamming", "positive")
    with pytest.raises(ValueError, match="epsilon"):
        DirectLoss(epsilon=0.0)
    with pytest.raises(ValueError, match="margin"):
        DirectLoss(margin=float("nan"))


def test_bad_name_in_the_config_fails_when_the_objective_is_built(compose_cfg, tmp_path):
    cfg = compose_cfg(["objective=direct_loss", "objective.update=hinges"])
    with pytest.raises(InstantiationException, match="hinge"):
        instantiate_runtime(cfg.objective, num_classes=2, pos_ratio=0.2)
    cfg = compose_cfg(["dataset=synthetic", *SMALL_SYNTHETIC, "objective=direct_loss",
                       "objective.task_loss=zero-one", "device=cpu", "trainer.max_steps=2"])
    with pytest.raises(ConfigError, match="ap, zero_one"):
        loop.train(cfg, tmp_path)


@pytest.mark.parametrize("update", UPDATES)
def test_batch_without_a_class(update):
    for labels in (torch.ones(5, dtype=torch.long), torch.zeros(5, dtype=torch.long)):
        ap = DirectLoss("ap", update)
        logits = torch.randn(5, 2, requires_grad=True)
        loss = ap(logits, labels)
        loss.backward()
        assert loss.item() == 0.0 and torch.all(logits.grad == 0)
        assert ap.pop_stats() == {"degenerate_batches": 1.0, "empty_batches": 1.0}
        zo = DirectLoss("zero_one", update, epsilon=5.0, margin=5.0)   # wide: every sample moves
        zo(torch.zeros(5, 2, requires_grad=True), labels)
        stats = zo.pop_stats()
        assert stats["degenerate_batches"] == 1.0 and stats["empty_batches"] == 0.0


def test_direct_ap_alias(compose_cfg):
    cfg = compose_cfg(["objective=direct_ap"]).objective
    assert cfg._target_ == "lpmetrics.baselines.direct_loss.DirectLoss"
    # item access: ``update`` is also a DictConfig method name
    assert (cfg["task_loss"], cfg["update"], cfg["epsilon"]) == ("ap", "positive", 0.1)
    assert compose_cfg(["objective=direct_ap", "objective.update=negative"]).objective["update"] == "negative"


@pytest.mark.parametrize("task_loss,update", list(itertools.product(sorted(TASK_LOSSES), UPDATES)))
def test_all_eight_train_through_train_py_on_synthetic(compose_cfg, tmp_path, task_loss, update):
    cfg = compose_cfg(["dataset=synthetic", *SMALL_SYNTHETIC, "objective=direct_loss",
                       f"objective.task_loss={task_loss}", f"objective.update={update}",
                       "trainer.max_steps=4", "trainer.eval_every=4", "trainer.batch_size=64",
                       "device=cpu", "optimizer.lr=0.01"])
    results = loop.train(cfg, tmp_path)
    assert results["final"]["step"] == 4 and math.isfinite(results["final"]["train_loss"])


# --- the data of the experiments (data/synthetic.py): App. 5.3's linear teacher and label noise

def test_linear_teacher_and_label_noise():
    from lpmetrics.data.synthetic import teacher_data
    x, y = teacher_data(2000, teacher="linear", pos_fraction=None, seed=3)
    np.testing.assert_array_equal(y, (x.sum(1) > 0).astype(np.int64))   # "sum [...] larger than 0"
    x2, noisy = teacher_data(2000, teacher="linear", pos_fraction=None, seed=3, label_noise=0.2)
    np.testing.assert_array_equal(x2, x)
    assert (noisy != y).sum() == 400                                     # exactly 20 % flipped
    _, top = teacher_data(2000, teacher="linear", pos_fraction=0.2, seed=3)
    assert top.sum() == 400
    relu_x, relu_y = teacher_data(500, hidden=(7, 5), seed=1)
    _, relu_noisy = teacher_data(500, hidden=(7, 5), seed=1, label_noise=0.1)
    assert (relu_noisy != relu_y).sum() == 50
    with pytest.raises(ValueError, match="relu"):
        teacher_data(100, teacher="quadratic")


def test_synthetic_linear_config_builds_a_linear_student(compose_cfg):
    from lpmetrics.run.builders import build_model
    from lpmetrics.data import build_data
    cfg = compose_cfg(["dataset=synthetic_linear", "dataset.source.label_noise=0.2", *SMALL_SYNTHETIC])
    bundle = build_data(cfg.dataset, seed=0)
    linears = [m for m in build_model(cfg, bundle).modules() if isinstance(m, torch.nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(10, 2)]   # phi = w^T x
    assert len(bundle.test) == 200
