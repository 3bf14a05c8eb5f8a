"""Oracle tests of the LP-layer baselines: cvxpylayers (baselines/cvxpy_lp.py), blackbox
differentiation (baselines/blackbox.py) and perturbed optimizers (baselines/perturbed.py).

Oracles: HiGHS on the same LP; our objectives (``AUCLoss``, ``F1LPLoss``, Newton solver) on the
same batches; the closed-form ramp-AUC; the exact gradient of Pogančić et al.'s interpolated loss
(finite differences of LP values); the Gaussian-smoothed box LP in closed form (Berthet et al.).
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from scipy.optimize import linprog

from lpmetrics.baselines.blackbox import AUCBlackboxLoss, BlackboxLP, HighsLP, auc_cost_lp
from lpmetrics.baselines.cvxpy_lp import AUCCvxpyLoss, CvxpyLP, F1CvxpyLoss
from lpmetrics.baselines.perturbed import PerturbedLP
from lpmetrics.run.builders import instantiate_runtime
from lpmetrics.objectives.auc import AUCLoss, auc_pairs
from lpmetrics.objectives.common import binary_scores
from lpmetrics.objectives.pairwise import neg_identity
from lpmetrics.objectives.ratio import F1LPLoss, phi_of_logits
from lpmetrics.solver import LPSolverError

# cvxpylayers 1.2's backward converts tensors with np.array (numpy-2 copy-keyword notice)
pytestmark = pytest.mark.filterwarnings("ignore:__array__ implementation doesn't accept:DeprecationWarning")
TIGHT = {"eps_abs": 1e-9, "eps_rel": 1e-9, "max_iters": 200000}   # SCS as an oracle-grade solver
CONFIGS = __import__("pathlib").Path(__file__).resolve().parents[1] / "configs" / "objective"


def constructed_lp(rng, m: int, n: int, p: int = 0) -> dict:
    """A random LP with a unique nondegenerate optimum z* built by complementary slackness:
    n - p of the rows/bounds are active with positive multipliers, the rest have slack."""
    A, A_eq = rng.standard_normal((m, n)), (rng.standard_normal((p, n)) if p else None)
    k = n - p
    n_rows = min(m, int(rng.integers(0, k + 1)))
    rows, bounds = rng.choice(m, n_rows, replace=False), rng.choice(n, k - n_rows, replace=False)
    z = rng.uniform(0.5, 2.0, n)
    z[bounds] = 0.0
    slack = rng.uniform(0.2, 1.5, m)
    slack[rows] = 0.0
    u, v = np.zeros(m), np.zeros(n)
    u[rows], v[bounds] = rng.uniform(0.5, 2.0, n_rows), rng.uniform(0.5, 2.0, k - n_rows)
    c = -A.T @ u + v - (A_eq.T @ rng.standard_normal(p) if p else 0.0)
    return dict(c=c, A=A, b=A @ z + slack, A_eq=A_eq, b_eq=A_eq @ z if p else None, z=z)


def to_torch(lp: dict) -> dict:
    return {k: None if lp[k] is None else torch.tensor(lp[k]) for k in ("c", "A", "b", "A_eq", "b_eq")}


def lp_value(lp, c):
    res = linprog(c, A_ub=lp["A"], b_ub=lp["b"], A_eq=lp["A_eq"], b_eq=lp["b_eq"],
                  bounds=(0, None), method="highs")
    return res.fun


def batch(seed: int, n: int = 16, scale: float = 2.0):
    g = torch.Generator().manual_seed(seed)
    logits = (scale * torch.randn(n, 2, generator=g)).double()
    labels = torch.randint(0, 2, (n,), generator=g)
    labels[:2] = torch.tensor([0, 1])
    return logits, labels


def margins(logits, labels):
    return auc_pairs(binary_scores(logits, "softmax"), labels)


# ---------------------------------------------------------------- cvxpylayers -----------------

@pytest.mark.parametrize("seed", range(3))
def test_cvxpy_layer_matches_highs(seed):
    lp = constructed_lp(np.random.default_rng(seed), m=8, n=6, p=1)
    t = to_torch(lp)
    z = CvxpyLP(solver_args=TIGHT)(t["c"], t["A"], t["b"], t["A_eq"], t["b_eq"])
    assert float(t["c"] @ z) == pytest.approx(lp_value(lp, lp["c"]), abs=1e-6)
    np.testing.assert_allclose(z.numpy(), lp["z"], atol=1e-5)   # unique by construction


def test_cvxpy_layer_gradient_matches_finite_differences():
    lp = constructed_lp(np.random.default_rng(7), m=6, n=4)
    t = to_torch(lp)
    layer = CvxpyLP(solver_args={**TIGHT, "mode": "dense"})
    w = torch.randn(4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    b = t["b"].clone().requires_grad_()
    (w @ layer(t["c"], t["A"], b)).backward()
    with torch.no_grad():   # z* is affine in b on the active set: central differences are exact
        h = 1e-4
        fd = torch.stack([(w @ layer(t["c"], t["A"], t["b"] + h * e)
                           - w @ layer(t["c"], t["A"], t["b"] - h * e)) / (2 * h)
                          for e in torch.eye(6, dtype=torch.float64)])
    np.testing.assert_allclose(b.grad.numpy(), fd.numpy(), atol=1e-4)


@pytest.mark.parametrize("seed,eps", [(0, 0.1), (1, 0.01), (2, 0.1)])
def test_auc_cvxpy_matches_our_auc_loss_and_closed_form(seed, eps):
    logits, labels = batch(seed)
    cv = AUCCvxpyLoss(epsilon=eps, solver_args=TIGHT)
    ours = AUCLoss(epsilon=eps)(logits, labels)
    closed = AUCLoss(epsilon=eps, method="closed_form")(logits, labels)
    loss = cv(logits, labels)
    assert loss.item() == pytest.approx(ours.item(), abs=1e-4)
    assert loss.item() == pytest.approx(closed.item(), abs=1e-4)
    d = margins(logits, labels)   # the unique optimum z_ij = max(0, eps - d_ij)
    z = cv.layer(torch.ones_like(d), neg_identity(d.numel(), d), d - eps)
    np.testing.assert_allclose(z.numpy(), torch.relu(eps - d).numpy(), atol=1e-6)
    dense = AUCCvxpyLoss(epsilon=eps, solver_args=TIGHT, structure="dense")(logits, labels)
    assert dense.item() == pytest.approx(closed.item(), abs=1e-4)


@pytest.mark.parametrize("seed", range(3))
def test_auc_cvxpy_gradient_matches_closed_form_away_from_kinks(seed):
    eps = 0.1
    logits, labels = batch(seed, scale=0.5)
    d = margins(logits, labels)
    kink = torch.minimum(d.abs(), (d - eps).abs()).min().item()
    assert kink > 1e-4, "batch too close to a kink of the ramp; pick another seed"
    grads = []
    for loss_fn in (AUCCvxpyLoss(epsilon=eps, solver_args=TIGHT),
                    AUCLoss(epsilon=eps, method="closed_form")):
        x = logits.clone().requires_grad_()
        loss_fn(x, labels).backward()
        grads.append(x.grad)
    assert grads[1].abs().max() > 1e-3   # the batch has pairs inside the ramp
    np.testing.assert_allclose(grads[0].numpy(), grads[1].numpy(), atol=1e-3 * grads[1].abs().max().item())


@pytest.mark.parametrize("seed", range(3))
def test_f1_cvxpy_matches_our_f1_loss_and_highs(seed):
    logits, labels = batch(seed, scale=1.0)
    cv = F1CvxpyLoss(solver_args=TIGHT)
    ours = F1LPLoss()
    xs = [logits.clone().requires_grad_() for _ in range(2)]
    losses = [cv(xs[0], labels), ours(xs[1], labels)]
    assert losses[0].item() == pytest.approx(losses[1].item(), abs=1e-4)
    for loss, x in zip(losses, xs):
        loss.backward()
    cos = torch.nn.functional.cosine_similarity(xs[0].grad.flatten(), xs[1].grad.flatten(), 0)
    assert cos > 0.999
    phi = phi_of_logits(logits).clamp(-1 + 1e-6, 1 - 1e-6)
    lp = cv.build_lp(phi, (labels == 1).double())
    z = cv.layer(lp.c, lp.A, lp.b, lp.A_eq, lp.b_eq)
    res = linprog(lp.c.numpy(), A_ub=lp.A.numpy(), b_ub=lp.b.numpy(), A_eq=lp.A_eq.numpy(),
                  b_eq=lp.b_eq.numpy(), bounds=(0, None), method="highs")
    assert -losses[0].item() == pytest.approx(-res.fun, abs=1e-6)
    np.testing.assert_allclose(z.numpy(), res.x, atol=1e-5)   # unique: one active row per sample


@pytest.mark.parametrize("knobs", [{"bound": "mid"}, {"bound": "lower"},
                                   {"phi": "softmax_st", "margin": 0.5}])
def test_f1_cvxpy_follows_the_relaxation_knobs(knobs):
    """Same loss and gradient as f1_lp for every bound / margin / phi: only the solver differs."""
    logits, labels = batch(7, scale=1.0)
    xs = [logits.clone().requires_grad_() for _ in range(2)]
    losses = [F1CvxpyLoss(solver_args=TIGHT, **knobs)(xs[0], labels), F1LPLoss(**knobs)(xs[1], labels)]
    assert losses[0].item() == pytest.approx(losses[1].item(), abs=1e-6)
    grads = [torch.autograd.grad(loss, x)[0] for loss, x in zip(losses, xs)]
    assert torch.allclose(grads[0], grads[1], atol=1e-5)


def test_cvxpy_layer_caches_by_shape_and_evicts():
    layer = CvxpyLP(cache_size=2)
    for n in (3, 4, 3, 5, 3):
        c = -torch.ones(n, dtype=torch.float64)
        z = layer(c, torch.ones(1, n, dtype=torch.float64), torch.ones(1, dtype=torch.float64))
        assert float(z.sum()) == pytest.approx(1.0, abs=1e-3)
    assert layer.compiles == 3 and len(layer._layers) == 2   # 3 reused, 4 evicted by 5


def test_cvxpy_layer_failure_paths():
    with pytest.raises(ValueError, match="diffcp cone solver"):
        CvxpyLP(solver="GUROBI")
    with pytest.raises(ValueError, match=r"\[m, n\]"):
        CvxpyLP()(torch.ones(2), torch.ones(3, 2), torch.ones(2))
    with pytest.raises(ValueError, match=r"\[m, n\]"):   # a diagonal A must be square
        CvxpyLP()(torch.ones(2), neg_identity(2, torch.ones(2)), torch.ones(3))
    with pytest.raises(ValueError, match="together"):
        CvxpyLP()(torch.ones(2), torch.ones(1, 2), torch.ones(1), torch.ones(1, 2))
    layer = CvxpyLP()
    with pytest.raises(LPSolverError) as err:   # z >= 0, z1 + z2 <= -1
        layer(torch.ones(2), torch.ones(1, 2), -torch.ones(1))
    assert err.value.kind == "infeasible"
    with pytest.raises(LPSolverError) as err:   # min -z1 + z2, -z1 + z2 <= 1
        layer(torch.tensor([-1.0, 1.0]), torch.tensor([[-1.0, 1.0]]), torch.ones(1))
    assert err.value.kind == "unbounded"
    with pytest.raises(ValueError, match="structure"):
        AUCCvxpyLoss(structure="sparse")


# ---------------------------------------------------------------- blackbox --------------------

@pytest.mark.parametrize("seed", range(3))
def test_blackbox_forward_equals_linprog_batched(seed):
    rng = np.random.default_rng(seed)
    lp = constructed_lp(rng, m=7, n=5, p=1)
    layer = BlackboxLP(lp["A"], lp["b"], lp["A_eq"], lp["b_eq"], lam=1.0)
    C = torch.tensor(np.stack([lp["c"], lp["c"] + 0.3 * rng.standard_normal(5)]))
    Z = layer(C)
    for c, z in zip(C.numpy(), Z.numpy()):
        np.testing.assert_allclose(c @ z, lp_value(lp, c), atol=1e-8)


@pytest.mark.parametrize("seed,lam", [(0, 0.5), (1, 2.0), (2, 10.0)])
def test_blackbox_gradient_is_exact_gradient_of_interpolated_loss(seed, lam):
    """For L = <w, z*(c)> Pogančić et al.'s f_lam(c) = (h(c + lam w) - h(c)) / lam with
    h(c) = min_z c^T z; f_lam is piecewise linear, so central differences are exact."""
    rng = np.random.default_rng(seed)
    lp = constructed_lp(rng, m=6, n=4)
    w = rng.standard_normal(4)
    c = torch.tensor(lp["c"], requires_grad=True)
    (torch.tensor(w) @ BlackboxLP(lp["A"], lp["b"], lam=lam)(c)).backward()

    def f_lam(cc):
        return (lp_value(lp, cc + lam * w) - lp_value(lp, cc)) / lam

    h = 1e-6
    fd = np.array([(f_lam(lp["c"] + h * e) - f_lam(lp["c"] - h * e)) / (2 * h) for e in np.eye(4)])
    np.testing.assert_allclose(c.grad.numpy(), fd, atol=1e-6)


def test_blackbox_gradient_vanishes_for_tiny_lambda():
    lp = constructed_lp(np.random.default_rng(3), m=6, n=4)
    c = torch.tensor(lp["c"], requires_grad=True)
    BlackboxLP(lp["A"], lp["b"], lam=1e-6)(c).sum().backward()
    assert c.grad.abs().max() == 0.0     # the vertex does not move: the known zero-gradient regime


def test_auc_blackbox_with_lam_epsilon_has_the_ramp_gradient():
    eps = 0.1
    logits, labels = batch(1, n=24, scale=0.5)
    d = margins(logits, labels)
    xs = [logits.clone().requires_grad_() for _ in range(2)]
    loss = AUCBlackboxLoss(epsilon=eps, lam=eps)(xs[0], labels)
    assert loss.item() == pytest.approx(float((d < eps).double().mean()), abs=1e-12)
    loss.backward()
    AUCLoss(epsilon=eps, method="closed_form")(xs[1], labels).backward()
    np.testing.assert_allclose(xs[0].grad.numpy(), xs[1].grad.numpy(), atol=1e-12)
    c, A, b = auc_cost_lp(d, eps)   # the dual's optimum is the primal's closed form
    u = HighsLP(A, b)(c)
    np.testing.assert_allclose((-(c * u)).numpy(), torch.relu(eps - d).numpy(), atol=1e-12)


def test_blackbox_failure_paths():
    with pytest.raises(ValueError, match="lam"):
        BlackboxLP(torch.ones(1, 2), torch.ones(1), lam=0.0)
    with pytest.raises(ValueError, match=r"\[m, n\]"):
        BlackboxLP(torch.ones(2, 2), torch.ones(3))
    layer = BlackboxLP(torch.ones(1, 2), torch.ones(1))
    with pytest.raises(ValueError, match="c must be"):
        layer(torch.ones(3))
    with pytest.raises(LPSolverError) as err:    # unbounded: z2 free to grow with cost -1
        BlackboxLP(torch.tensor([[1.0, -1.0]]), torch.ones(1))(torch.tensor([0.0, -1.0]))
    assert err.value.kind == "unbounded"
    with pytest.raises(LPSolverError) as err:
        BlackboxLP(torch.ones(1, 2), -torch.ones(1))(torch.ones(2))
    assert err.value.kind == "infeasible"


# ---------------------------------------------------------------- perturbed -------------------

def test_perturbed_mean_tends_to_the_vertex_as_sigma_vanishes():
    lp = constructed_lp(np.random.default_rng(0), m=6, n=4)
    c = torch.tensor(lp["c"])
    for sigma, atol in [(1e-3, 1e-6), (1e-6, 1e-8)]:
        z = PerturbedLP(lp["A"], lp["b"], sigma=sigma, n_samples=5, seed=0)(c)
        np.testing.assert_allclose(z.numpy(), lp["z"], atol=atol)


def test_perturbed_box_lp_matches_gaussian_closed_form():
    """min c^T z s.t. z <= 1: z*_i = 1[c_i < 0], z_sigma = Phi(-c/sigma), J = diag(-phi(c/sigma)/sigma)."""
    sigma, N = 1.0, 2000
    c0 = torch.tensor([-0.5, 0.2, 1.0], dtype=torch.float64)
    layer = PerturbedLP(torch.eye(3), torch.ones(3), sigma=sigma, n_samples=N, seed=0)
    layer.lp.solve = lambda C: (np.asarray(C).reshape(-1, 3) < 0).astype(np.float64)  # argmin, fast
    noise = layer.sample_noise(c0)
    z = layer(c0, noise)
    jac = torch.autograd.functional.jacobian(lambda cc: layer(cc, noise), c0)
    normal = torch.distributions.Normal(0.0, 1.0)
    mc_std = 1.0 / math.sqrt(N)   # z in {0, 1}, Z ~ N(0, 1): both estimators have std <= 1/sqrt(N)
    np.testing.assert_allclose(z.numpy(), normal.cdf(-c0 / sigma).numpy(), atol=4 * mc_std)
    exact = torch.diag(-normal.log_prob(c0 / sigma).exp() / sigma)
    np.testing.assert_allclose(jac.numpy(), exact.numpy(), atol=4 * mc_std / sigma)


def test_perturbed_box_lp_through_highs_is_seeded():
    layer = PerturbedLP(torch.eye(2), torch.ones(2), sigma=0.5, n_samples=4, seed=3)
    z1 = layer.__class__(torch.eye(2), torch.ones(2), sigma=0.5, n_samples=4, seed=3)(torch.zeros(2))
    z2 = layer(torch.zeros(2))
    assert torch.equal(z1, z2) and set(np.unique(4 * z1.numpy())) <= {0, 1, 2, 3, 4}
    with pytest.raises(ValueError, match="sigma"):
        PerturbedLP(torch.eye(2), torch.ones(2), sigma=0.0)
    with pytest.raises(ValueError, match="noise"):
        layer(torch.zeros(2), torch.zeros(4, 3))


@pytest.mark.slow
def test_perturbed_jacobian_matches_common_random_number_finite_differences():
    """The score-function Jacobian vs central differences of the Monte-Carlo mean with common
    random numbers (a step h of order sigma, so that vertices switch for many samples)."""
    lp = constructed_lp(np.random.default_rng(1), m=4, n=3)
    sigma, N, h = 0.5, 3000, 0.1
    layer = PerturbedLP(lp["A"], lp["b"], sigma=sigma, n_samples=N, seed=0)
    c0 = torch.tensor(lp["c"])
    noise = layer.sample_noise(c0)
    jac = torch.autograd.functional.jacobian(lambda cc: layer(cc, noise), c0)
    with torch.no_grad():
        fd = torch.stack([(layer(c0 + h * e, noise) - layer(c0 - h * e, noise)) / (2 * h)
                          for e in torch.eye(3, dtype=torch.float64)], 1)
    np.testing.assert_allclose(jac.numpy(), fd.numpy(), atol=0.15 * max(1.0, fd.abs().max().item()))


# ---------------------------------------------------------------- training smoke --------------

@pytest.mark.parametrize("name", ["auc_cvxpy", "f1_cvxpy", "auc_blackbox"])
def test_objective_config_trains_a_linear_model(name):
    cfg = OmegaConf.create({"objective": OmegaConf.load(CONFIGS / f"{name}.yaml")})
    objective = instantiate_runtime(cfg.objective, num_classes=2, input_shape=[8], pos_ratio=0.5,
                                    class_counts=[10, 10])
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    before = model.weight.detach().clone()
    for step in range(3):
        x = torch.randn(16, 8)
        y = (x[:, 0] + 0.5 * torch.randn(16) > 0).long()
        y[:2] = torch.tensor([0, 1])
        loss = objective(model(x), y)
        assert torch.isfinite(loss)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert not torch.equal(before, model.weight)
    stats = objective.pop_stats()
    assert stats["degenerate_batches"] == 0.0


@pytest.mark.parametrize("name", ["auc_cvxpy", "f1_cvxpy", "auc_blackbox"])
def test_train_py_runs_the_objective(compose_cfg, tmp_path, name):
    import pandas as pd
    from lpmetrics.run import loop
    cfg = compose_cfg(["dataset=digits", "model=mlp", "trainer.max_steps=10", "trainer.eval_every=5",
                       "trainer.batch_size=16", "device=cpu", "logger=csv", f"objective={name}"])
    loop.train(cfg, tmp_path)
    rows = pd.read_csv(tmp_path / "metrics.csv")
    assert list(rows["step"]) == [5, 10] and rows["train_loss"].notna().all()
