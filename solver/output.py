r"""From a forward's ``run`` to the :class:`solver.LPSolution`: the backward attached, the LP
mapped back, the diagnostics collected.

Every forward (Newton's eps loop, :mod:`solver.eps_loop`; HiGHS, :mod:`solver.backends.highs`;
a certified ``vertex_guess``) ends in the same ``run`` dict, and :func:`assemble` turns it into
the solution: the active-set backward (Meng et al. 2021, sec. 4.2; :func:`solver.implicit.active_set_output`)
or the unrolled one (:func:`solver.implicit.unrolled_output`) attached to the vertex, the
equilibration (:mod:`solver.preprocess.scaling`) and presolve (:mod:`solver.preprocess.presolve`)
undone exactly, and the statistics a training run logs (:func:`run_stats`: iterations, KKT residual,
primal infeasibility, dual residual, duality gap, active-set size, eps) read back in one
host transfer.
"""
from __future__ import annotations

import time

import torch

from lpmetrics.solver.implicit import active_set_output, unrolled_output
from lpmetrics.solver.linsolve import NewtonSystem
from lpmetrics.solver.preprocess.presolve import restore, restore_masks
from lpmetrics.solver.solution import LPSolution


def run_stats(prob, run, method, seconds, forward="newton"):
    """``(stats, instance_stats)`` of :class:`solver.LPSolution`: the batch's worst case as
    Python numbers (one host transfer) and the per-LP tensors in the caller's batch shape."""
    rec = run["rec"]
    active = rec.wA.sum(-1) + rec.wz.sum(-1)
    per = {"iterations": run["iterations"], "converged": run["done"],
           "kkt_residual": rec.kkt, "primal_infeasibility": rec.primal_inf,
           "dual_residual": rec.dual_res, "duality_gap": rec.gap, "active_count": active,
           "eps": run["eps"], "eps_steps": run["eps_steps"]}
    per = {k: prob.unflatten(v.detach() if v.requires_grad else v) for k, v in per.items()}
    # one host transfer for all the scalars (float64 holds every value exactly)
    with torch.no_grad():
        f64 = torch.float64
        if prob.B == 1:   # worst case over one LP = its value
            one = [run["iterations"], run["done"], rec.kkt.reshape(1), rec.primal_inf,
                   rec.dual_res, rec.gap, active.float(), run["eps"], run["eps_steps"]]
            # .item() syncs nothing on the CPU; elsewhere cat (promoting to a common dtype)
            # makes it one transfer
            vals = ([t.item() for t in one] if prob.device.type == "cpu"
                    else torch.cat(one).tolist())
        else:
            vals = torch.stack([run["iterations"].max().to(f64), run["done"].all().to(f64),
                                per["kkt_residual"].max().to(f64),
                                rec.primal_inf.max().to(f64), rec.dual_res.max().to(f64),
                                rec.gap.max().to(f64), active.float().mean().to(f64),
                                run["eps"].min().to(f64),
                                run["eps_steps"].max().to(f64)]).tolist()
    stats = {"iterations": int(vals[0]),
             "converged": bool(vals[1]),
             "kkt_residual": vals[2],
             "primal_infeasibility": vals[3],
             "dual_residual": vals[4],
             "duality_gap": vals[5],
             "active_count": vals[6],
             "eps": vals[7],
             "eps_steps": int(vals[8]),
             "linear_solver": method,
             # the recovery's / backward's K_T solver: "dense_lu" / "sparse_lu" (the square
             # active system factorised on the host, solver.backends.square_active), "active_lu" (its
             # sparse LU inside the torch recovery, solver.backends.active_lu) or the linear_solver's
             # least-squares path
             "active_factor": getattr(rec.system, "factor_kind", method),
             "forward": forward,
             "cg_iterations": int(run["cg_iterations"]),
             "batch_size": prob.B,
             "seconds": seconds}
    return stats, per


def empty_solution(prob, c, b, seconds: float, forward: str = "newton") -> LPSolution:
    """The solution of an empty batch (a leading dimension of size 0): every field has the batch
    shape with zero LPs; ``z`` and ``value`` stay connected to ``c`` and ``b`` (zero gradient)."""
    shape = tuple(prob.batch_shape)
    link = 0.0 * (c.sum() + b.sum())    # empty sums are 0: connects the outputs to the graph

    def zeros(*tail, dtype=c.dtype):
        return torch.zeros(shape + tail, dtype=dtype, device=c.device)

    stats = {"iterations": 0, "converged": True, "kkt_residual": 0.0, "primal_infeasibility": 0.0,
             "dual_residual": 0.0, "duality_gap": 0.0, "active_count": 0.0, "eps": 0.0,
             "eps_steps": 0, "linear_solver": "none", "cg_iterations": 0, "batch_size": 0,
             "seconds": seconds, "forward": forward}
    return LPSolution(z=zeros(prob.n) + link, value=zeros() + link, dual=zeros(prob.m),
                      active=zeros(prob.m, dtype=torch.bool), stats=stats, instance_stats={},
                      dual_eq=zeros(prob.p) if prob.p else None, dual_bounds=zeros(prob.n),
                      active_bounds=zeros(prob.n, dtype=torch.bool), eps=zeros(),
                      penalty_z=zeros(prob.n))


def assemble(prob, work, sc, run, method, backward, out_dtype, forward, t0):
    """The :class:`LPSolution`: the forward's vertex with its backward attached, mapped back
    from the equilibrated (:mod:`solver.preprocess.scaling`) and presolved (:mod:`solver.preprocess.presolve`) LP
    ``work`` where there was one."""
    rec, red = run["rec"], run.get("reduction")
    if backward == "unrolled":
        z = unrolled_output(rec.z, run["zp"])
    elif red is None:
        z = active_set_output(work, rec.z, rec.system)
    else:                   # presolved: the backward is attached below, on the LP as given
        z = rec.z
    uA, uz, uE, zp = rec.uA, rec.uz, rec.uE, run["zp"].detach()
    if sc is not None:      # z = D_s z_hat, u_A = D_r u_A_hat, u_z = u_z_hat / D_s, ...
        z, zp, uA, uz = z * sc.s, zp * sc.s, uA * sc.r, uz / sc.s
        uE = None if uE is None else uE * sc.re
    active, active_bounds = rec.wA > 0, rec.wz > 0
    if red is not None:     # presolved: removed rows and variables back in
        z, uA, uz, uE = restore(prob, red, z.detach(), uA, uz, uE)
        zp = red.fixed.detach().to(zp.dtype).index_copy(1, red.cols.nonzero().flatten(), zp)
        active, active_bounds = restore_masks(prob, red, active, active_bounds, z)
        # the backward on the LP as given, with its full active set: the reduced LP has no
        # entries for the zeros of a removed row or column, whose derivatives are not zero
        # (a zero of a singleton row still moves the vertex when it becomes nonzero)
        system = NewtonSystem(prob, active.to(prob.dtype), active_bounds.to(prob.dtype),
                              torch.zeros_like(prob.c_scale), method, pinv=True,
                              cg_tol=rec.system.cg_tol, cg_max_iter=rec.system.cg_max_iter)
        z = active_set_output(prob, z.to(prob.dtype), system)
    def out(t, size):                 # the caller's batch shape and dtype
        t = prob.unflatten(t, (size,))
        return t if t.dtype == out_dtype else t.to(out_dtype)

    z_out = out(z, prob.n)
    value = (out(prob.c, prob.n) * z_out).sum(-1)
    stats, per = run_stats(work, run, method, time.perf_counter() - t0, forward)
    stats["equilibrated"] = sc is not None
    stats["presolve"] = None if red is None else {
        "rows_removed": int((~red.rows).sum()) + int((~red.eq_rows).sum()),
        "cols_removed": int((~red.cols).sum())}
    return LPSolution(
        z=z_out, value=value,
        dual=out(uA, prob.m),
        active=prob.unflatten(active, (prob.m,)),
        stats=stats, instance_stats=per,
        dual_eq=None if uE is None else out(uE, prob.p),
        dual_bounds=out(uz, prob.n),
        active_bounds=prob.unflatten(active_bounds, (prob.n,)),
        eps=None if forward != "newton" else prob.unflatten(run["eps"].detach()),
        penalty_z=prob.unflatten(zp, (prob.n,)))
