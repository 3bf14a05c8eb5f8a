"""The pack-wide SGD update in one compiled pass per stacked tensor (``PackedSGD(fused=...)``).

Oracle: the eager update (``fused=False``, today's kernels; itself equal to N ``torch.optim.SGD``
steps, ``tests/test_packed_capture.py``), in float64 on the CPU, over six steps that cover the
first step's buffer init, per-run momentum (one run without), dampening, weight decay, nesterov,
lr changes between steps (by the runs' own ``param_groups``, as their schedulers make them) and a
run frozen from step 3 on. Measured here (torch 2.14.1, x86 CPU): equal to 3.2e-16 relative to
max(1, |value|) (nesterov or not, momentum or not), not bitwise: ATen's CPU ``addcmul`` rounds
``self + t1 * t2`` once (its build contracts it into an FMA), Inductor's C++ rounds the product
first; the frozen run is kept bit for bit. Also: at most one kernel per stacked tensor in the
compiled code, the per-run ``momentum_buffer`` views that checkpoints save (also with the eager
update), the fallback with its reason where compiling fails, and a CUDA-graph stand-in. The real
capture is a CUDA-only test (skipped here). A first compile costs 5-60 s on the CPU (Inductor's
cache warm or cold).
"""
from __future__ import annotations

import re

import pytest
import torch

from lpmetrics.models.mlp import MLP
from lpmetrics.objectives.ce import CrossEntropy
from lpmetrics.objectives.common import labels_checked
from lpmetrics.packed import PackedStep, pack
from lpmetrics.packed.optim import PackedSGD
from tests.test_packed_capture import data, replayed

SHAPE = [3, 4, 4]
N = 4
SGDS = [dict(lr=0.1, momentum=0.9, weight_decay=5e-4), dict(lr=0.05, momentum=0.0, weight_decay=1e-3),
        dict(lr=0.02, momentum=0.5, dampening=0.1, weight_decay=0.0), dict(lr=0.3, momentum=0.9, weight_decay=0.0)]
TOL = 1e-12   # relative to max(1, |value|)


def sgd_kwargs(i: int, nesterov: bool = False, momentum: bool = True) -> dict:
    kw = dict(SGDS[i])
    if not momentum:
        kw.update(momentum=0.0, dampening=0.0)
    if nesterov:   # torch.optim.SGD's nesterov needs momentum > 0 and dampening 0
        kw.update(momentum=kw["momentum"] or 0.3, dampening=0.0, nesterov=True)
    return kw


def packed_sgd(fused, nesterov=False, momentum=True, device="cpu"):
    torch.manual_seed(0)
    packed = pack([MLP(2, SHAPE, hidden=[8]).to(device) for _ in range(N)])
    opts = [torch.optim.SGD(m.parameters(), **sgd_kwargs(i, nesterov, momentum))
            for i, m in enumerate(packed.models)]
    return packed, opts, PackedSGD(packed, opts, fused=fused)


def worst(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max()) / max(1.0, float(b.abs().max()))


def run_both(steps: int = 6, fused=True, **kw):
    """The eager and the one-pass update fed the same gradients; lr changes at step 2; run 2
    frozen from step 3. Returns both (packed, opts, update) and the largest relative difference
    of parameters and momentum buffers over all steps."""
    eager, onepass = packed_sgd(False, **kw), packed_sgd(fused, **kw)
    g = torch.Generator().manual_seed(1)
    diff, frozen_rows = 0.0, None
    for t in range(steps):
        for k, p in eager[0].params.items():
            grad = torch.randn(p.shape, generator=g, dtype=p.dtype)
            p.grad, onepass[0].params[k].grad = grad.clone(), grad.clone()
        if t == 2:   # a milestone: each run's scheduler sets its own lr
            for _, opts, _ in (eager, onepass):
                opts[0].param_groups[0]["lr"], opts[3].param_groups[0]["lr"] = 0.07, 0.11
        frozen = torch.tensor([False, False, True, False]) if t >= 3 else None
        if t == 3:
            frozen_rows = {k: p.detach()[2].clone() for k, p in onepass[0].params.items()}
        eager[2].step(frozen)
        onepass[2].step(frozen)
        for k, p in eager[0].params.items():
            diff = max(diff, worst(onepass[0].params[k].detach(), p.detach()))
            if k in eager[2].momentum:
                diff = max(diff, worst(onepass[2].momentum[k], eager[2].momentum[k]))
    for k, p in onepass[0].params.items() if frozen_rows else ():   # run 2: its values before step 3
        assert torch.equal(p.detach()[2], frozen_rows[k]), k
    return eager, onepass, diff


@pytest.mark.parametrize("fused", [False, True])
def test_a_checkpoint_leaves_the_momentum_views_in_place(float64_default, fused):
    """``optimizer.state_dict()`` (each evaluation's last.pt) hands out copies of the momentum
    rows and leaves the live state a view of the stacked buffer, so the next checkpoint saves the
    momentum of its own step, not the first checkpoint's."""
    packed, opts, update = packed_sgd(fused)
    saved = []
    for _ in range(3):
        for p in packed.params.values():
            p.grad = torch.randn_like(p)
        update.step()
        saved.append(opts[0].state_dict()["state"][0]["momentum_buffer"])
    first = next(iter(packed.params))
    live = opts[0].state[packed.models[0].get_parameter(first)]["momentum_buffer"]
    assert live.data_ptr() == update.momentum[first].data_ptr()   # row 0 of the stacked buffer
    assert torch.equal(saved[-1], update.momentum[first][0]) and not torch.equal(saved[0], saved[-1])
    assert saved[-1].untyped_storage().nbytes() == saved[-1].numel() * saved[-1].element_size()


@pytest.mark.parametrize("nesterov", [False, True])
def test_one_pass_equals_the_eager_update(float64_default, nesterov):
    eager, onepass, diff = run_both(nesterov=nesterov)
    assert onepass[2].fused_note == "one pass" and eager[2].fused_note == "kernels"
    assert diff <= TOL, diff
    # the checkpointed state: each run's momentum_buffer is still a view of its stacked row
    packed, opts, update = onepass
    for i, opt in enumerate(opts):
        state = opt.state_dict()["state"]
        want = eager[1][i].state_dict()["state"]
        assert state.keys() == want.keys()
        if not opt.param_groups[0]["momentum"]:
            assert not state   # torch.optim.SGD keeps no buffer without momentum
            continue
        for j, k in enumerate(packed.params):
            live = opt.state[packed.models[i].get_parameter(k)]["momentum_buffer"]
            assert live.data_ptr() == update.momentum[k][i].data_ptr()
            assert worst(state[j]["momentum_buffer"], want[j]["momentum_buffer"]) <= TOL


def test_one_pass_without_momentum(float64_default):
    eager, onepass, diff = run_both(momentum=False)
    assert not onepass[2].momentum and onepass[2].fused_note == "one pass"
    assert diff <= TOL, diff
    assert all(o._opt_called for o in onepass[1])   # the schedulers' "optimizer stepped" flag


def test_the_compiled_update_is_at_most_one_kernel_per_stacked_tensor(float64_default):
    """The eager update launches 3-4 kernels per stacked tensor (with momentum); the compiled
    code launches at most one (the CPU backend even fuses all tensors into one)."""
    from torch._inductor.utils import run_and_get_code
    from lpmetrics.packed.optim import _one_pass
    packed, _, update = packed_sgd(True)
    for p in packed.params.values():
        p.grad = torch.randn_like(p)
    update.step()   # the eager first step: the buffers
    params = list(packed.params.values())
    with torch.no_grad():   # as PackedSGD.step calls it
        _, code = run_and_get_code(torch.compile(_one_pass, fullgraph=True), params, [p.grad for p in params],
                                   [update.momentum[k] for k in packed.params], update.hyper,
                                   update.no_frozen, True, False)
    calls = re.findall(r"^\s+(?:cpp|triton)_\w+\(", "\n".join(code), re.M)
    assert 1 <= len(calls) <= len(params), calls


def test_fallback_keeps_the_reason_and_fused_true_raises(float64_default, monkeypatch):
    def broken(fn, **kw):
        def call(*a, **k):
            raise RuntimeError("no C++ compiler")
        return call

    monkeypatch.setattr(torch, "compile", broken)
    eager, auto, diff = run_both(steps=3, fused="auto")
    assert diff == 0.0   # the same kernels
    assert auto[2].fused_note == "kernels (the one pass did not compile: RuntimeError: no C++ compiler)"
    _, _, strict = packed_sgd(True)
    for p in strict.packed.params.values():
        p.grad = torch.ones_like(p)
    strict.step()   # the first step is eager
    with pytest.raises(RuntimeError, match="fused='auto' to fall back"):
        strict.step()
    with pytest.raises(ValueError, match="fused='yes'"):
        packed_sgd("yes")


def test_one_pass_in_a_graph_stand_in_needs_one_capture(float64_default):
    """A pack stepped by GraphedStep (its CPU stand-in for the graph: replays redo the tensor work,
    none of the Python) with the one-pass update equals the eager update stepped eagerly, with
    one capture over lr milestones (the lrs are device rows refreshed outside the graph)."""
    def stepper(fused):
        packed, opts, update = packed_sgd(fused)
        scheds = [torch.optim.lr_scheduler.MultiStepLR(o, m, gamma=0.5)
                  for o, m in zip(opts, ([2, 4], [3], [], [1, 2]))]
        st = PackedStep(packed, [CrossEntropy() for _ in range(N)], opts, scheds, sync_free=True,
                        pack_update=True)
        st.update = update   # PackedStep builds the eager update; the one pass is PackedSGD's option
        return st

    eager, st = stepper(False), stepper(True)
    graphed = replayed(st, warmup=2)   # step 0 makes the buffers, step 1 compiles, then capture
    with labels_checked():
        for t, (x, y) in enumerate(data(N, 6, seed=3)):
            a, b = eager.step(x, y, t), graphed.step(x, y, t)
            assert worst(b.losses, a.losses) <= TOL
            for k in eager.packed.params:
                assert worst(st.packed.params[k].detach(), eager.packed.params[k].detach()) <= TOL
    assert graphed.captures == 1 and st.update.fused_note == "one pass"
    assert [o.param_groups[0]["lr"] for o in st.optimizers] == [o.param_groups[0]["lr"] for o in eager.optimizers]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graph capture needs CUDA")
def test_one_pass_captured_in_a_cuda_graph_equals_the_eager_update():
    """float32 on CUDA: two eager steps (buffers, compile), then the one pass captured once and
    replayed with lr changes made by refresh(); no host sync inside. Inductor's CUDA addcmul is
    written to round as ATen's, so the printed difference may be 0.0: record it."""
    dev = torch.device("cuda")
    eager, onepass = packed_sgd(False, device=dev), packed_sgd(True, device=dev)
    g = torch.Generator(device=dev).manual_seed(1)
    grads = [{k: torch.randn(p.shape, generator=g, device=dev) for k, p in eager[0].params.items()}
             for _ in range(6)]

    def feed(which, t, in_place=False):
        for k, p in which[0].params.items():
            if in_place:   # into the .grad tensors the graph captured
                p.grad.copy_(grads[t][k])
            else:
                p.grad = grads[t][k].clone()

    for t in range(2):
        for which in (eager, onepass):
            feed(which, t)
            which[2].step()
    assert onepass[2].fused_note == "one pass"
    graph = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        torch.cuda.set_sync_debug_mode("error")
        try:
            onepass[2].step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    # the capture did not run the update: the graph's first replay is step 2
    for t in range(2, 6):
        if t == 4:
            for _, opts, _ in (eager, onepass):
                opts[0].param_groups[0]["lr"] = 0.07
        feed(eager, t)
        eager[2].step()
        feed(onepass, t, in_place=True)
        onepass[2].refresh()
        graph.replay()
    torch.cuda.synchronize()
    diffs = {k: worst(onepass[0].params[k].detach(), p.detach()) for k, p in eager[0].params.items()}
    print("one pass vs eager on CUDA, max relative difference:", max(diffs.values()))   # run with -s
    assert max(diffs.values()) <= 1e-6


def stepper(fused_update):
    torch.manual_seed(0)
    packed = pack([MLP(2, SHAPE, hidden=[8]) for _ in range(N)])
    opts = [torch.optim.SGD(m.parameters(), **sgd_kwargs(i)) for i, m in enumerate(packed.models)]
    return PackedStep(packed, [CrossEntropy() for _ in range(N)], opts, [None] * N,
                      pack_update=True, fused_update=fused_update)


def test_the_pack_step_takes_the_one_pass_update_and_trains_as_the_eager_one(float64_default):
    """``PackedStep(fused_update=...)`` (the launcher's and ``campaign run --fused-update``'s
    switch) hands it to its :class:`PackedSGD`: whole steps (forward, losses, backward, update)
    with the one pass stay within float64 rounding of the eager update's."""
    eager, onepass = stepper(False), stepper(True)
    assert eager.update.fused is False and onepass.update.fused is True
    assert "one pass" in onepass.update_note and "kernels" in eager.update_note
    for t, (x, y) in enumerate(data(N, 4)):
        eager.step(x.double(), y, t)
        onepass.step(x.double(), y, t)
    for k, p in eager.packed.params.items():
        assert worst(onepass.packed.params[k].detach(), p.detach()) <= TOL, k
    assert onepass.update.fused_note == "one pass"
    assert onepass.update_note == "pack-wide SGD (one pass)"   # read when asked, not at construction
