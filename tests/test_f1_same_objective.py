"""The F1 table's rows: f1_lp_paper and f1_cvxpy solve one objective, f1_apperf clips its gradient.

Meng et al. 2021 §5: "our solver, CVXPY-SCS and AP-Perf seek to solve the same objective". For
our solver and CVXPY-SCS that objective is the paper's relaxation of the F1 LP,

    max_{z,t} 2 Y^T z  s.t.  1^T z + P t = 1,  l_i t <= z_i <= u_i t,  z, t >= 0,
    l_i = max(0, phi_i),  u_i = min(1, 1 + phi_i),  phi_i = 2 softmax(f(x_i))_1 - 1,

(the Charnes-Cooper form of max 2 Y^T Yhat / (1^T Yhat + P) over the boxes; loss = -optimum).
Oracles: that LP written here from the paper and solved by HiGHS (scipy.optimize.linprog), and its
closed form (positives at the top of their boxes, negatives at the bottom).
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from scipy.optimize import linprog

from lpmetrics.run.builders import instantiate_runtime

MISSING = [m for m in ("cvxpy", "cvxpylayers", "diffcp") if importlib.util.find_spec(m) is None]
needs_cvxpy = pytest.mark.skipif(bool(MISSING), reason=f"objective=f1_cvxpy needs {', '.join(MISSING)} "
                                 "(pip install -r requirements.txt)")

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
RUNTIME = {"num_classes": 2, "input_shape": [8], "pos_ratio": 0.5, "class_counts": [32, 32]}
# The keys that define the LP and its loss; the rest of each objective block picks a solver.
OBJECTIVE_KEYS = ("phi", "bound", "margin", "safeguard", "positive_class")
SOLVER_KEYS = {"_target_", "backward", "solver", "solver_args", "n_jobs", "cache_size"}
# SCS's default eps_abs = eps_rel = 1e-4 bound its residuals, not the optimum; on these batches the
# default config lands within 5e-5 of HiGHS (F1 in [0, 1]): 1e-3 leaves room, 1e-6 when tight.
SCS_DEFAULT_ATOL = 1e-3


def batch(seed: int, n: int = 64, scale: float = 2.0):
    """Logits ``[n, 2]`` (float64) and labels with both classes, as a training batch."""
    g = torch.Generator().manual_seed(seed)
    logits = scale * torch.randn(n, 2, generator=g, dtype=torch.float64)
    labels = torch.randint(0, 2, (n,), generator=g)
    labels[:2] = torch.tensor([0, 1])
    return logits, labels


def paper_lp_highs(logits: torch.Tensor, labels: torch.Tensor) -> float:
    """The optimum of the paper's F1 LP (module docstring) by HiGHS, built from the formula."""
    phi = torch.tanh((logits[:, 1] - logits[:, 0]) / 2).numpy()
    assert np.abs(phi).max() < 1 - 1e-6   # the objective's LICQ clamp leaves these scores alone
    y = (labels == 1).double().numpy()
    n = len(y)
    lo, hi = np.maximum(0.0, phi), np.minimum(1.0, 1.0 + phi)
    eye = np.eye(n)
    A_ub = np.block([[eye, -hi[:, None]], [-eye, lo[:, None]]])          # z <= u t, l t <= z
    A_eq = np.concatenate([np.ones(n), [y.sum()]])[None]                  # 1^T z + P t = 1
    res = linprog(np.concatenate([-2 * y, [0.0]]), A_ub=A_ub, b_ub=np.zeros(2 * n), A_eq=A_eq,
                  b_eq=[1.0], bounds=(0, None), method="highs")
    assert res.status == 0, res.message
    closed = 2 * (y * hi).sum() / ((y * hi).sum() + ((1 - y) * lo).sum() + y.sum())
    assert -res.fun == pytest.approx(closed, abs=1e-9)
    return -res.fun


def objective(compose_cfg, name: str, *overrides: str):
    return instantiate_runtime(compose_cfg([f"objective={name}", *overrides]).objective, **RUNTIME)


# ------------------------------------------------------------------ configs ---------------------

@pytest.mark.parametrize("experiment", [[], ["experiment=table_f1", "optimizer.lr=0.01"]])
def test_f1_lp_paper_and_f1_cvxpy_differ_only_in_the_solver(compose_cfg, experiment):
    """Alone and as rows of the F1 table: every key outside ``objective`` is equal, and inside
    it only the solver's keys differ."""
    paper, cvxpy = (OmegaConf.to_container(compose_cfg([f"objective={o}", *experiment]), resolve=True)
                    for o in ("f1_lp_paper", "f1_cvxpy"))
    obj_paper, obj_cvxpy = paper.pop("objective"), cvxpy.pop("objective")
    assert paper == cvxpy
    for key in OBJECTIVE_KEYS:
        assert obj_paper[key] == obj_cvxpy[key], key
    assert set(obj_paper) ^ set(obj_cvxpy) <= SOLVER_KEYS
    assert {k for k in set(obj_paper) & set(obj_cvxpy) if obj_paper[k] != obj_cvxpy[k]} <= SOLVER_KEYS
    # the paper's relaxation: softmax scores, the LP maximum, no margin
    assert (obj_paper["phi"], obj_paper["bound"], obj_paper["margin"]) == ("softmax", "upper", 0.0)


def test_f1_lp_is_the_recipe_not_the_papers_objective(compose_cfg):
    recipe = compose_cfg(["objective=f1_lp"])
    assert (recipe.objective.phi, recipe.objective.margin, recipe.optimizer.lr) == ("softmax_st", 0.5, 0.01)


def test_table_f1_sweeps_the_paper_relaxation_beside_the_recipe():
    rows = str(OmegaConf.load(CONFIGS / "experiment" / "table_f1.yaml").hydra.sweeper.params.objective)
    assert sorted(rows.split(",")) == ["ce", "f1_apperf", "f1_cvxpy", "f1_lp", "f1_lp_paper"]


def test_f1_apperf_clips_its_gradient_and_only_it(compose_cfg):
    assert compose_cfg(["objective=f1_apperf"]).trainer.max_grad_norm == 5.0
    table = compose_cfg(["experiment=table_f1", "objective=f1_apperf", "optimizer.lr=0.1"])
    assert table.trainer.max_grad_norm == 5.0 and table.optimizer.lr == 0.1
    assert compose_cfg(["objective=f1_apperf", "trainer.max_grad_norm=null"]).trainer.max_grad_norm is None
    for other in ("ce", "f1_lp_paper", "f1_cvxpy", "f1_lp"):   # the trainer's default stays unclipped
        assert compose_cfg(["experiment=table_f1", f"objective={other}"]).trainer.max_grad_norm is None


def test_apperf_gradient_is_summed_and_ignores_loss_scaling():
    """Why f1_apperf clips: its gradient is q_check - y per sample, summed over the batch, and
    the package's backward drops the upstream gradient, so dividing the loss by B changes nothing."""
    pytest.importorskip("ap_perf")
    from lpmetrics.baselines.apperf import APPerfF1

    logits, labels = batch(0, n=16)
    loss_fn = APPerfF1()
    grads = []
    for scale in (1.0, 1 / 16):
        x = logits.float().requires_grad_()
        (scale * loss_fn(x, labels)).backward()
        grads.append(x.grad)
    assert torch.equal(grads[0], grads[1])
    margin_grad = grads[0][:, 1]   # d loss / d l_1 = q_check - y: in [-1, 1] per sample, up to the
    assert margin_grad.abs().max() <= 1.01 and margin_grad.abs().sum() > 1.0   # ADMM's ~1e-3 slack


# ------------------------------------------------------------------ losses ----------------------

@pytest.mark.parametrize("seed", range(8))
def test_f1_lp_paper_loss_is_minus_the_papers_lp_optimum(compose_cfg, seed):
    logits, labels = batch(seed)
    loss = objective(compose_cfg, "f1_lp_paper")(logits, labels)
    assert -loss.item() == pytest.approx(paper_lp_highs(logits, labels), abs=1e-9)


@needs_cvxpy
@pytest.mark.parametrize("seed", range(8))
def test_f1_cvxpy_loss_equals_f1_lp_papers(compose_cfg, seed):
    n = (64, 64, 64, 64, 16, 16, 32, 128)[seed]
    logits, labels = batch(seed, n=n, scale=(2.0, 0.5, 4.0)[seed % 3])
    oracle = paper_lp_highs(logits, labels)
    ours = objective(compose_cfg, "f1_lp_paper")(logits, labels).item()
    scs = objective(compose_cfg, "f1_cvxpy")(logits, labels).item()     # the config as it runs
    tight = objective(compose_cfg, "f1_cvxpy", "+objective.solver_args.eps_abs=1e-9",
                      "+objective.solver_args.eps_rel=1e-9",
                      "+objective.solver_args.max_iters=200000")(logits, labels).item()
    assert -ours == pytest.approx(oracle, abs=1e-9)
    assert scs == pytest.approx(ours, abs=SCS_DEFAULT_ATOL)
    assert tight == pytest.approx(ours, abs=1e-6)


@needs_cvxpy
def test_both_give_zero_loss_on_a_batch_without_positives(compose_cfg):
    logits = batch(0, n=16)[0]
    labels = torch.zeros(16, dtype=torch.long)
    for name in ("f1_lp_paper", "f1_cvxpy"):
        fn = objective(compose_cfg, name)
        assert fn(logits, labels).item() == 0.0
        assert fn.pop_stats()["degenerate_batches"] == 1.0
