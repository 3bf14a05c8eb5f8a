"""Measurement side of the solver benchmark (entry point and method: ``scripts/solver/bench_solver.py``):
the problem instances, one forward(+backward) call per method (:func:`make_auc_call`,
:func:`make_f1_call`, :func:`make_sparse_call`, the paper's dense recipe, HiGHS), peak memory,
:func:`measure`,
:func:`accuracy` and :func:`run_worker`, which runs one cell in the ``--worker`` subprocess."""
from __future__ import annotations

import ctypes
import gc
import statistics
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]

EPS = 0.01                  # ramp width: the paper's epsilon (Meng et al. 2021 §5)
POSITIVES = {"balanced": 0.5, "91%": 0.91}
AUC_METHODS = ["ours", "ours_csr", "ours_dense", "cvxpylayers", "highs", "dense_paper",
               "closed_form"]
F1_METHODS = ["ours", "cvxpylayers", "highs"]
SPARSE_METHODS = ["newton", "newton_highs", "highs"]


# ---------------------------------------------------------------------------------- instances
def auc_instance(batch, positives, dtype, device, seed=0):
    """Scores ``[batch]`` (sigmoid of normals, as softmax outputs), labels, weights ``[pairs]``."""
    g = torch.Generator().manual_seed(seed)
    n_pos = min(batch - 1, max(1, round(positives * batch)))
    labels = (torch.arange(batch) < n_pos).long().to(device)
    scores = torch.sigmoid(torch.randn(batch, generator=g, dtype=torch.float64))
    w = torch.rand(n_pos * (batch - n_pos), generator=g, dtype=torch.float64)
    return (scores.to(dtype=dtype, device=device).requires_grad_(), labels,
            w.to(dtype=dtype, device=device))


def f1_instance(n, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, 2, generator=g, dtype=torch.float64)
    labels = (torch.rand(n, generator=g) < 0.5).long()
    labels[0] = 1                                        # at least one positive
    return logits.to(dtype=dtype, device=device).requires_grad_(), labels.to(device)


def random_sparse_lp(n, seed=0):
    """Random sparse LP, feasible and bounded by construction, numpy/scipy float64:
    ``n // 2 + 1`` random rows (density 5e-3 at n <= 500, else 1e-3: ~1-20 entries a row)
    ``A0 z <= A0 z0 + u``, the box ``z <= 3`` and ``max(1, n // 50)`` equality rows
    ``A_eq z = A_eq z0`` at a point ``z0 ~ U(0, 1)^n``; ``c`` standard normal.
    Returns ``(c, A, b, A_eq, b_eq)`` with ``A, A_eq`` scipy CSR."""
    import scipy.sparse as sp
    g = np.random.default_rng(seed)
    density = 5e-3 if n <= 500 else 1e-3
    rand = lambda rows: sp.random(rows, n, density=density, random_state=g,  # noqa: E731
                                  data_rvs=g.standard_normal, format="csr")
    A0, A_eq = rand(n // 2 + 1), rand(max(1, n // 50))
    z0 = g.uniform(0, 1, n)
    b0 = A0 @ z0 + g.uniform(0, 1, A0.shape[0])
    A = sp.vstack([A0, sp.identity(n)], format="csr")
    return (g.standard_normal(n), A, np.concatenate([b0, np.full(n, 3.0)]), A_eq, A_eq @ z0)


def torch_csr(A, dtype):
    """scipy sparse -> ``torch.sparse_csr_tensor``."""
    A = A.tocsr()
    return torch.sparse_csr_tensor(torch.tensor(A.indptr), torch.tensor(A.indices),
                                   torch.tensor(A.data, dtype=dtype), A.shape)


def pairs_of(batch, positives):
    n_pos = min(batch - 1, max(1, round(positives * batch)))
    return n_pos * (batch - n_pos)


# ---------------------------------------------------------------------------- dense recipe
def dense_paper_auc(d, eps):
    """The authors' recipe on a materialised ``A = [-I; -I]`` (``2M x M``), ``b = [d - eps; 0]``:
    ridge (1e-3) least-squares start, 20 full Newton steps on the penalty
    ``1/2 |(Az - b)_+|^2 + 1e-3 c^T z`` with ``(A^T D A + 1e-4 I)^{-1}`` formed by a dense inverse,
    dual by thresholding, primal from the active rows with ridge 0.01; autograd through all of it.
    (``D`` is applied as a row scaling instead of the authors' ``2M x 2M`` ``diag_embed``.)"""
    M = d.numel()
    eye = torch.eye(M, dtype=d.dtype, device=d.device)
    A = torch.cat([-eye, -eye], 0)
    b = torch.cat([d - eps, torch.zeros_like(d)])
    c = torch.ones_like(d)
    x = torch.linalg.solve(A[:M].T @ A[:M] + 1e-3 * eye, A[:M].T @ b[:M])
    for _ in range(20):
        r = A @ x - b
        P = A.T @ ((r > 0).to(d.dtype)[:, None] * A) + 1e-4 * eye
        x = x - torch.inverse(P) @ (A.T @ torch.relu(r) + 1e-3 * c)
    active = (torch.relu(A @ x - b) / eps > 0).detach()
    Aj, bj = A[active], b[active]
    return torch.linalg.solve(Aj.T @ Aj + 0.01 * eye, Aj.T @ bj)


def dense_paper_cost(M, itemsize):
    """(bytes, flops) of :func:`dense_paper_auc` with its autograd graph (20 saved P, P^-1, DA)."""
    return itemsize * M * M * (3 + 20 * 4), 3 * 20 * (4 + 2) * M ** 3


# ------------------------------------------------------------------------------- methods
def highs(c, A_ub, b_ub, A_eq=None, b_eq=None):
    """HiGHS (dual simplex / presolve) through scipy; returns ``(x, objective)``."""
    from scipy.optimize import linprog
    res = linprog(c, A_ub=A_ub, b_ub=b_ub, A_eq=A_eq, b_eq=b_eq, bounds=(0, None),
                  method="highs")
    if res.status != 0:
        raise RuntimeError(f"HiGHS failed: {res.message}")
    return res.x, float(res.fun)


def auc_highs_value(d):
    import scipy.sparse as sp
    M = d.numel()
    dd = d.detach().cpu().double().numpy()
    return highs(np.ones(M), -sp.identity(M, format="csr"), dd - EPS)[1]


def make_auc_call(method, batch, positives, dtype, device, seed=0):
    """A callable doing one forward(+backward) and returning the LP objective ``1^T z``."""
    from lpmetrics.objectives.auc import auc_pairs
    from lpmetrics.objectives.pairwise import neg_identity, ramp_lp
    s, y, w = auc_instance(batch, positives, dtype, device, seed)
    if method == "highs":
        import scipy.sparse as sp
        A = -sp.identity(w.numel(), format="csr")          # prebuilt: favourable to HiGHS

        def call():
            d = auc_pairs(s.detach(), y).cpu().double().numpy()
            return highs(np.ones(d.size), A, d - EPS)[1]
        return call
    if method == "cvxpylayers":
        from lpmetrics.baselines.cvxpy_lp import CvxpyLP
        layer = CvxpyLP(solver="SCS", n_jobs=1)

    if method in ("ours_csr", "ours_dense"):     # the general paths on the same LP
        import scipy.sparse as sp
        from lpmetrics.solver import solve_lp
        M = w.numel()
        A = torch_csr(-sp.identity(M, format="csr"), dtype).to(device) if method == "ours_csr" \
            else -torch.eye(M, dtype=dtype, device=device)

    def call():
        s.grad = None
        d = auc_pairs(s, y)
        if method == "ours":
            z, sol = ramp_lp(d, EPS)
            call.stats = sol.stats
        elif method in ("ours_csr", "ours_dense"):
            sol = solve_lp(torch.ones_like(d), A, d - EPS)
            z, call.stats = sol.z, sol.stats
        elif method == "closed_form":
            z, _ = ramp_lp(d, EPS, method="closed_form")
        elif method == "cvxpylayers":
            z = layer(torch.ones_like(d), neg_identity(d.numel(), d), d - EPS)
        else:
            z = dense_paper_auc(d, EPS)
        (z * w).sum().backward()
        return float(z.detach().double().sum())
    return call


def make_f1_call(method, n, dtype, device, seed=0):
    from lpmetrics.objectives.ratio import F1LPLoss, phi_of_logits, PHI_MARGIN
    logits, labels = f1_instance(n, dtype, device, seed)
    if method == "highs":
        import scipy.sparse as sp
        phi = phi_of_logits(logits.detach()).clamp(-1 + PHI_MARGIN, 1 - PHI_MARGIN)
        lp = F1LPLoss().build_lp(phi, labels.to(dtype))
        args = [t.detach().cpu().double().numpy() for t in (lp.c, lp.A, lp.b, lp.A_eq, lp.b_eq)]
        args[1], args[3] = sp.csr_matrix(args[1]), sp.csr_matrix(args[3])  # prebuilt

        def call():
            return highs(*args)[1]
        return call
    if method == "cvxpylayers":
        from lpmetrics.baselines.cvxpy_lp import F1CvxpyLoss
        loss_fn = F1CvxpyLoss(n_jobs=1)
    else:
        loss_fn = F1LPLoss()

    def call():
        logits.grad = None
        loss = loss_fn(logits, labels)     # = c^T x*, the LP objective (-relaxed F1)
        loss.backward()
        if method == "ours":
            call.stats = loss_fn.pop_stats()   # mean Newton iterations of the solve
        return float(loss.detach().double())
    return call


def make_sparse_call(method, n, dtype, device, seed=0):
    """Random sparse LP (:func:`random_sparse_lp`): ``newton`` / ``newton_highs`` = ``solve_lp``
    (``forward="newton"`` / ``forward="highs"``) fwd+bwd of ``sum(z * w)`` w.r.t. ``b``; ``highs`` =
    HiGHS's forward alone on the prebuilt scipy matrices."""
    from lpmetrics.solver import solve_lp
    c, A, b, A_eq, b_eq = random_sparse_lp(n, seed)
    if method == "highs":
        return lambda: highs(c, A, b, A_eq, b_eq)[1]
    ct, bt, beq = (torch.tensor(v, dtype=dtype, device=device) for v in (c, b, b_eq))
    At, Aeq = torch_csr(A, dtype).to(device), torch_csr(A_eq, dtype).to(device)
    w = torch.randn(n, generator=torch.Generator().manual_seed(1), dtype=dtype).to(device)
    # "newton" names the Newton forward explicitly: the default forward="auto" sends these
    # general LPs (n >= 256, CPU) to HiGHS, which is what newton_highs measures
    kw = {"forward": "highs" if method == "newton_highs" else "newton"}

    def call():
        b_ = bt.clone().requires_grad_()
        sol = solve_lp(ct, At, b_, Aeq, beq, **kw)
        (sol.z * w).sum().backward()
        call.stats = sol.stats
        return float((ct.double() * sol.z.detach().double()).sum())
    return call


# -------------------------------------------------------------------------- measurement
def _proc_kb(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1])
    return 0


def _mallopt(mmap_threshold, trim_threshold):
    """glibc: blocks above ``mmap_threshold`` are mmap'ed (and unmapped when freed)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, mmap_threshold)     # M_MMAP_THRESHOLD
        libc.mallopt(-1, trim_threshold)     # M_TRIM_THRESHOLD
        libc.malloc_trim(0)
    except OSError:
        pass


def peak_memory_mb(call, device):
    """Peak memory of one call above what was in use before it (MiB).  On the CPU this must run
    before anything has been freed to glibc's heap under its default (dynamic) mmap threshold:
    a heap chunk reused by the call would not raise the high-water mark."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        call()
        return (torch.cuda.max_memory_allocated() - base) / 2**20
    _mallopt(128 * 1024, 128 * 1024)
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")                     # reset VmHWM to the current RSS
    except OSError:
        return float("nan")
    base = _proc_kb("VmRSS")
    call()
    return (_proc_kb("VmHWM") - base) / 1024


def measure(spec):
    """One cell: warm-up, median time of repeated calls, peak memory, objective value."""
    dtype, device = getattr(torch, spec["dtype"]), torch.device(spec["device"])
    if spec["problem"] == "auc":
        call = make_auc_call(spec["method"], spec["size"], POSITIVES[spec["positives"]],
                             dtype, device)
    elif spec["problem"] == "sparse":
        call = make_sparse_call(spec["method"], spec["size"], dtype, device)
    else:
        call = make_f1_call(spec["method"], spec["size"], dtype, device)

    def timed():
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        value = call()
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t0, value

    first, value = timed()                   # warm-up (with big blocks mmap'ed, see run_worker)
    out = {"value": value, "first_s": first}
    if first > spec["cap_s"]:          # one call only: the warm-up is the sample
        out.update(times_ms=[1e3 * first], note="1 call incl. warm-up")
        out["peak_mb"] = float("nan")
    else:
        out["peak_mb"] = peak_memory_mb(call, device)
        _mallopt(32 * 2**20, 64 * 2**20)     # ~glibc's own steady state for the timing
        if first < 1.0:                # fast calls: warm up ~1 s (lazy init, caches)
            until = time.perf_counter() + min(1.0, max(0.3, 5 * first))
            while time.perf_counter() < until:
                timed()
        min_n = 1 if first > 10 else 3 if first > 2 else 5
        times = []
        while len(times) < min_n or (len(times) < spec["max_calls"]
                                     and sum(times) < spec["budget_s"]):
            times.append(timed()[0])
        out["times_ms"] = [1e3 * t for t in times]
    out["median_ms"] = statistics.median(out["times_ms"])
    out["stats"] = {k: v for k, v in getattr(call, "stats", {}).items()
                    if k in ("iterations", "eps_steps", "linear_solver", "lp_iterations")}
    return out


def accuracy(spec):
    """Max relative objective error of our solver vs HiGHS on the same data, f64 and f32."""
    from lpmetrics.objectives.auc import auc_pairs
    from lpmetrics.objectives.pairwise import ramp_lp
    from lpmetrics.objectives.ratio import F1LPLoss, PHI_MARGIN, phi_of_logits
    from lpmetrics.objectives.common import solve
    device = torch.device(spec["device"])
    out = {}
    # the random sparse LPs are timed in float64 (bench_solver.cells): no float32 row
    for dname in ("float64",) if spec["problem"] == "sparse" else ("float64", "float32"):
        errs, refs = [], []
        for seed in range(spec["seeds"]):
            dtype = getattr(torch, dname)
            if spec["problem"] == "sparse":
                ours = make_sparse_call("newton", spec["size"], dtype, device, seed)()
                ref = highs(*random_sparse_lp(spec["size"], seed))[1]
            elif spec["problem"] == "auc":
                s, y, _ = auc_instance(spec["size"], POSITIVES[spec["positives"]], dtype,
                                       device, seed)
                d = auc_pairs(s, y)
                ours = float(ramp_lp(d, EPS)[0].detach().double().sum())
                ref = auc_highs_value(d)
            else:
                import scipy.sparse as sp
                logits, labels = f1_instance(spec["size"], dtype, device, seed)
                phi = phi_of_logits(logits).clamp(-1 + PHI_MARGIN, 1 - PHI_MARGIN)
                lp = F1LPLoss().build_lp(phi, labels.to(dtype))
                sol = solve(lp.c, lp.A, lp.b, lp.A_eq, lp.b_eq)
                ours = float((lp.c.double() * sol.z.detach().double()).sum())
                a = [t.detach().cpu().double().numpy() for t in (lp.c, lp.A, lp.b, lp.A_eq,
                                                                 lp.b_eq)]
                ref = highs(a[0], sp.csr_matrix(a[1]), a[2], sp.csr_matrix(a[3]), a[4])[1]
            errs.append(abs(ours - ref) / max(abs(ref), 1e-12))
            refs.append(ref)
        out[dname] = {"err": max(errs), "highs_seed0": refs[0]}
    return out


def run_worker(spec):
    torch.manual_seed(0)
    _mallopt(128 * 1024, 128 * 1024)         # before any allocation: see peak_memory_mb
    return accuracy(spec) if spec["method"] == "accuracy" else measure(spec)
