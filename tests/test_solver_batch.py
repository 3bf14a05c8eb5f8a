"""Batching, broadcasting, structured operators, warm start, sketch, the layer, devices."""
import doctest
import time

import numpy as np
import pytest
import torch

import lpmetrics.solver.layer as solver_layer
from lpmetrics.solver import (DiagonalOperator, LPLayer, SparseOperator, VStackOperator, solve_lp)
from tests.test_solver_oracle import check_against_highs, constructed_lp, random_lp, to_torch


def _stack(lps, key):
    return torch.tensor(np.stack([lp[key] for lp in lps]))


def test_batched_equals_per_instance():
    rng = np.random.default_rng(0)
    lps = [constructed_lp(rng, 40, 12, 2, degenerate=i == 1) for i in range(5)]
    sol = solve_lp(*(_stack(lps, k) for k in ("c", "A", "b", "A_eq", "b_eq")))
    assert sol.z.shape == (5, 12) and sol.value.shape == (5,) and sol.dual.shape == (5, 40)
    assert sol.instance_stats["iterations"].shape == (5,)
    for i, lp in enumerate(lps):
        T = to_torch(lp)
        one = solve_lp(T["c"], T["A"], T["b"], T["A_eq"], T["b_eq"])
        assert torch.allclose(sol.z[i], one.z, atol=1e-10)
        assert torch.allclose(sol.value[i], one.value, atol=1e-10)
        check_against_highs(lp, one)


def test_broadcast_shared_matrix_and_multi_dim_batch():
    rng = np.random.default_rng(1)
    lp = constructed_lp(rng, 30, 6)
    T = to_torch(lp)
    slack = torch.tensor(rng.uniform(0, 1, (2, 3, 30)))
    b = T["b"] + slack                       # [2, 3, m] with a shared A [m, n] and c [n]
    sol = solve_lp(T["c"], T["A"], b)
    assert sol.z.shape == (2, 3, 6) and sol.active.shape == (2, 3, 30)
    for i in range(2):
        for j in range(3):
            one = solve_lp(T["c"], T["A"], b[i, j])
            assert torch.allclose(sol.z[i, j], one.z, atol=1e-10)


def test_warm_start_reuses_solution():
    lp = constructed_lp(np.random.default_rng(2), 120, 30, 1)
    T = to_torch(lp)
    args = (T["c"], T["A"], T["b"], T["A_eq"], T["b_eq"])
    cold = solve_lp(*args)
    warm = solve_lp(*args, warm_start=cold)
    assert torch.allclose(cold.z, warm.z, atol=1e-10)
    assert warm.stats["iterations"] < cold.stats["iterations"]
    warm_z = solve_lp(*args, warm_start=cold.z)           # a plain z0 also works
    assert torch.allclose(cold.z, warm_z.z, atol=1e-10)


@pytest.mark.parametrize("kind", ["gaussian", "sampling"])
def test_sketched_newton_returns_the_same_vertex(kind):
    rng = np.random.default_rng(3)
    lp = constructed_lp(rng, 150, 10, 1)
    T = to_torch(lp)
    sol = solve_lp(T["c"], T["A"], T["b"], T["A_eq"], T["b_eq"], sketch=kind, sketch_size=40,
                   max_iter=300)
    assert np.abs(sol.z.detach().numpy() - lp["z"]).max() < 1e-9


def test_auc_lp_with_diagonal_operator_matches_closed_form():
    """Binary-AUC LP: min 1^T z s.t. -z <= d - eps, z >= 0  =>  z = relu(eps - d)."""
    torch.manual_seed(0)
    for dtype in (torch.float32, torch.float64):
        d = torch.randn(20000, dtype=dtype, requires_grad=True)
        sol = solve_lp(torch.ones(20000, dtype=dtype),
                       DiagonalOperator(-torch.ones(20000, dtype=dtype)), d - 0.1)
        assert sol.stats["linear_solver"] == "diagonal"
        assert torch.allclose(sol.z, torch.relu(0.1 - d), atol=1e-6)
        sol.z.sum().backward()
        assert torch.equal(d.grad, -(d < 0.1).to(dtype))


def test_box_rows_as_stacked_diagonals():
    """[-I; I] z <= [-lo; hi] with cost c: z = lo where c > 0, hi where c < 0."""
    rng = np.random.default_rng(4)
    n = 50
    lo, hi = torch.tensor(rng.uniform(0, 1, n)), torch.tensor(rng.uniform(2, 3, n))
    c = torch.tensor(rng.standard_normal(n))
    A = VStackOperator([DiagonalOperator(-torch.ones(n, dtype=torch.float64)),
                        DiagonalOperator(torch.ones(n, dtype=torch.float64))])
    sol = solve_lp(c, A, torch.cat([-lo, hi]))
    assert torch.allclose(sol.z, torch.where(c > 0, lo, hi), atol=1e-9)


def test_sparse_batched_tensor():
    rng = np.random.default_rng(5)
    lps = [constructed_lp(rng, 20, 5) for _ in range(3)]
    A = _stack(lps, "A")
    sol = solve_lp(_stack(lps, "c"), A.to_sparse(), _stack(lps, "b"))
    ref = solve_lp(_stack(lps, "c"), A, _stack(lps, "b"))
    assert torch.allclose(sol.z, ref.z, atol=1e-9)
    op = SparseOperator.from_torch(A.to_sparse())
    assert torch.allclose(op.dense(), A)


def test_layer_docstring_runs():
    result = doctest.testmod(solver_layer, verbose=False)
    assert result.attempted > 0 and result.failed == 0


def test_layer_in_a_module():
    layer = LPLayer(tol=1e-10)
    lp = constructed_lp(np.random.default_rng(6), 20, 5)
    T = to_torch(lp, requires_grad=True)
    sol = layer(T["c"], T["A"], T["b"])
    sol.z.sum().backward()
    assert T["A"].grad is not None and layer.last_stats["converged"]
    with pytest.raises(ValueError, match="unknown solver option"):
        LPLayer(tolerance=1e-3)


def test_stats_keys_are_plain_python():
    lp, _ = random_lp(np.random.default_rng(7), 0)
    T = to_torch(lp)
    st = solve_lp(T["c"], T["A"], T["b"], T["A_eq"], T["b_eq"]).stats
    for key in ("iterations", "converged", "kkt_residual", "primal_infeasibility",
                "duality_gap", "active_count", "seconds"):
        assert isinstance(st[key], (int, float, bool)), key


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cuda_matches_cpu(dtype):
    lp = constructed_lp(np.random.default_rng(8), 60, 15, 1)
    T = to_torch(lp, dtype)
    cpu = solve_lp(T["c"], T["A"], T["b"], T["A_eq"], T["b_eq"])
    G = {k: v.cuda().requires_grad_() for k, v in T.items()}
    gpu = solve_lp(G["c"], G["A"], G["b"], G["A_eq"], G["b_eq"])
    gpu.z.sum().backward()
    assert gpu.z.device.type == "cuda" and G["b"].grad is not None
    tol = 1e-9 if dtype == torch.float64 else 1e-3
    assert torch.allclose(gpu.z.cpu(), cpu.z, atol=tol)
    d = torch.randn(100000, device="cuda")
    sol = solve_lp(torch.ones_like(d), DiagonalOperator(-torch.ones_like(d)), d - 0.1)
    assert torch.allclose(sol.z, torch.relu(0.1 - d), atol=1e-6)


@pytest.mark.slow
def test_auc_lp_4_2_million_pairs_fast():
    """The size of a 2048 x 2048 pair batch: O(m) time and memory (< 2 s on an idle core)."""
    torch.manual_seed(0)
    m = 4_200_000
    d = torch.randn(m, requires_grad=True)
    t0 = time.perf_counter()
    sol = solve_lp(torch.ones(m), DiagonalOperator(-torch.ones(m)), d - 0.1)
    sol.value.backward()
    elapsed = time.perf_counter() - t0
    assert torch.allclose(sol.z, torch.relu(0.1 - d), atol=1e-6)
    assert elapsed < 10.0   # loose: shared CI cores; ~2 s measured on one loaded core
