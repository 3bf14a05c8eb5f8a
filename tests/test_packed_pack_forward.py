"""One batched LP for the pairwise-LP runs of a pack (``PackedStep(batch_losses=True)``,
``PairwiseRampLP.pack_key`` / ``pack_forward``): the campaign's ``auc_lp`` packs on CUDA solved one
LP per run, one after another (the H100 window of 2026-11-27: each ``auc_lp`` run added ~4.9 ms to
a graphed pack step). The oracle is the per-run call, in float64 on the CPU: losses, gradients,
the statistics each run records, and a pack trained with and without batching."""
from __future__ import annotations

import copy

import pytest
import torch

from lpmetrics.models.mlp import MLP
from lpmetrics.objectives.auc import AUCLoss
from lpmetrics.objectives.auc_ova import AUCOneVsAllLoss
from lpmetrics.objectives.ce import CrossEntropy
from lpmetrics.objectives.common import labels_checked
from lpmetrics.packed import PackedStep, pack, param_groups
from lpmetrics.packed.speed import warm_on_side_stream

SHAPE = [3, 4, 4]


def dense(eps=0.01, **kw):
    obj = AUCLoss(method="lp", epsilon=eps, **kw).capture_safe_form()
    assert obj is not None and obj.pair_layout == "dense"
    return obj.double()


def batch(seed: int, b: int = 12, one_class: bool = False):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, 2, generator=g, dtype=torch.float64)
    y = torch.zeros(b, dtype=torch.long) if one_class else (torch.rand(b, generator=g) < 0.6).long()
    return x, y


def together_equals_alone(objs, data) -> list[torch.Tensor]:
    """``pack_forward`` of ``objs`` on ``data`` against each objective's own call on a copy:
    equal losses, input gradients and recorded statistics, bit for bit; returns the losses."""
    twins = copy.deepcopy(objs)
    xs = [x.clone().requires_grad_() for x, _ in data]
    xt = [x.clone().requires_grad_() for x, _ in data]
    with labels_checked():
        together = type(objs[0]).pack_forward(objs, xs, [y for _, y in data])
        alone = [o(x, y) for o, x, (_, y) in zip(twins, xt, data)]
    torch.stack(together).sum().backward()
    torch.stack(alone).sum().backward()
    for a, b_ in zip(together, alone):
        assert torch.equal(a, b_)
    for a, b_ in zip(xs, xt):
        assert torch.equal(a.grad, b_.grad)
    for o, t in zip(objs, twins):
        assert o.pop_stats() == t.pop_stats()
    return together


@pytest.mark.parametrize("seed", range(5))
def test_pack_forward_equals_the_separate_calls(seed):
    data = [batch(10 * seed + j, one_class=(j == 2)) for j in range(4)]   # run 2: no pair at all
    together = together_equals_alone([dense() for _ in range(4)], data)
    assert float(together[2].detach()) == 0.0


@pytest.mark.parametrize("seed", range(3))
def test_runs_of_different_epsilon_share_one_lp_and_equal_their_own_calls(seed):
    """An ε sweep in one pack (the ε table's blocks): each run's ε enters its own row of b."""
    data = [batch(100 + 10 * seed + j) for j in range(4)]
    together = together_equals_alone([dense(eps) for eps in (0.1, 0.01, 0.001, 0.01)], data)
    assert len({float(t.detach()) for t in together}) > 1


def test_only_runs_that_can_share_one_lp_get_a_key():
    base = dense()
    assert base.pack_key() == dense().pack_key() is not None
    assert dense(eps=0.1).pack_key() == base.pack_key()                       # ε is data: one LP
    assert dense(solver={"tol": 1e-7}).pack_key() != base.pack_key()         # other solver options
    assert AUCLoss(method="lp").pack_key() is None                            # masked layout: M varies
    assert AUCLoss(method="closed_form").pack_key() is None
    ova = AUCOneVsAllLoss(num_classes=3).capture_safe_form()
    assert ova is None or ova.pack_key() != base.pack_key()                   # another class


def build(objectives, batch_losses: bool):
    torch.manual_seed(0)
    nets = [MLP(2, SHAPE, hidden=[8]).double() for _ in objectives]
    packed = pack(nets)
    opts = [torch.optim.SGD(param_groups(m, o), lr=0.1, momentum=0.9) for m, o in zip(packed.models, objectives)]
    return packed, PackedStep(packed, objectives, opts, [None] * len(objectives), sync_free=True,
                              batch_losses=batch_losses)


def test_a_pack_trains_the_same_with_one_batched_lp(monkeypatch):
    objectives = [dense(), dense(), CrossEntropy().double(), dense(), dense(eps=0.1),
                  dense(solver={"tol": 1e-7})]
    calls = []
    real = AUCLoss.pack_forward
    monkeypatch.setattr(AUCLoss, "pack_forward", staticmethod(lambda o, x, y: calls.append(len(o)) or real(o, x, y)))
    runs = {flag: build(copy.deepcopy(objectives), flag) for flag in (True, False)}
    g = torch.Generator().manual_seed(3)
    with labels_checked():
        for step in range(4):
            x = torch.randn(6, 10, *SHAPE, generator=g, dtype=torch.float64)
            y = (torch.rand(6, 10, generator=g) < 0.5).long()
            y[1] = 1 if step == 2 else y[1]   # a batch without negatives in one LP run
            outs = {flag: st.step(x, y, step).losses for flag, (_, st) in runs.items()}
            assert torch.equal(outs[True], outs[False])
    assert calls == [4] * 4   # runs 0, 1, 3, 4 (another eps) share one LP per step; ce and run 5 alone
    (pa, sa), (pb, sb) = runs[True], runs[False]
    for k in pa.params:
        assert torch.equal(pa.params[k], pb.params[k])
    for oa, ob in zip(sa.objectives, sb.objectives):
        assert oa.pop_stats() == ob.pop_stats()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (a CUDA-graph capture)")
def test_an_epsilon_sweep_captures_in_a_cuda_graph():
    """The per-run ε column is filled on the device: nothing copied from the host while capturing."""
    objs = [dense(eps).cuda() for eps in (0.1, 0.01, 0.001)]
    data = [batch(200 + j) for j in range(3)]
    xs = [x.cuda() for x, _ in data]
    ys = [y.cuda() for _, y in data]
    with labels_checked():
        eager = type(objs[0]).pack_forward(objs, xs, ys)
        warm_on_side_stream(lambda: type(objs[0]).pack_forward(objs, xs, ys), xs[0].device, calls=1)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = type(objs[0]).pack_forward(objs, xs, ys)
        graph.replay()
    for a, b_ in zip(captured, eager):
        assert torch.equal(a, b_)
