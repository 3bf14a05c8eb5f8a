"""``packed.graph.GraphedStep``: its bookkeeping around a captured step, on the CPU.

A CUDA graph cannot be built here, so a stand-in replays the captured function by calling it. What
is tested is everything the GraphedStep itself decides, with the eager sync-free step as the
oracle, in float64, on a pack of ``ce`` and ``auc_lp_capture`` runs whose MultiStepLR schedules
change the lr twice:
- the steps it replays, warm-up and schedulers included, equal the eager steps bitwise;
- it recaptures exactly when an lr or the frozen set changes;
- the divergence step it records comes from the device counter, not from the captured step;
- it refuses packs that cannot be captured, and says why.
(That the capture itself works on a GPU is ``scripts/packed/check_packed_device.py``'s job.)
"""
from __future__ import annotations

import copy

import pytest
import torch

from lpmetrics.models.mlp import MLP
from lpmetrics.objectives.auc import AUCLoss
from lpmetrics.objectives.ce import CrossEntropy
from lpmetrics.objectives.common import labels_checked
from lpmetrics.packed import PackedStep, pack, param_groups
from lpmetrics.packed.graph import GraphedStep, capturable
from tests.test_packed import NaNAfter

SHAPE = [3, 4, 4]


class StandIn:
    """Replays by calling the captured function (a CUDA graph would rerun its kernels)."""

    def __init__(self, fn, device):
        self.fn, self.output = fn, None

    def replay(self):
        self.output = self.fn()


class CapturableNaN(NaNAfter):
    """:class:`tests.test_packed.NaNAfter`, declared capturable (NaN after ``at`` calls)."""

    capturable = True


def make_pack(objectives, milestones=(3, 5)):
    torch.manual_seed(0)
    packed = pack([MLP(2, SHAPE, hidden=[8]) for _ in objectives])
    opts = [torch.optim.SGD(param_groups(m, o), lr=0.1 * (i + 1), momentum=0.9, weight_decay=5e-4)
            for i, (m, o) in enumerate(zip(packed.models, objectives))]
    scheds = [torch.optim.lr_scheduler.MultiStepLR(o, list(milestones), gamma=0.5) for o in opts]
    packed.train()
    return packed, PackedStep(packed, objectives, opts, scheds, sync_free=True)


def objectives():
    return [CrossEntropy(), AUCLoss(epsilon=0.5, pair_layout="dense", solver={"capture_safe": True}),
            CrossEntropy()]


def data(steps, n=3):
    g = torch.Generator().manual_seed(2)
    out = []
    for _ in range(steps):
        y = (torch.rand(n, 12, generator=g) < 0.6).long()
        y[:, :2] = torch.tensor([0, 1])
        out.append((torch.randn(n, 12, *SHAPE, generator=g), y))
    return out


def test_replayed_steps_equal_eager_steps_and_recapture_at_each_lr_change(float64_default):
    (pa, eager), (pb, st) = make_pack(objectives()), make_pack(objectives())
    graphed = GraphedStep(st, warmup=2, make_graph=StandIn)
    with labels_checked():
        for t, (x, y) in enumerate(data(8)):
            a, b = eager.step(x, y, t), graphed.step(x, y, t)
            assert torch.equal(a.losses, b.losses), f"step {t}"
            for k in pa.params:
                assert torch.equal(pa.params[k], pb.params[k]), f"step {t} {k}"
            assert [o.param_groups[0]["lr"] for o in eager.optimizers] == \
                [o.param_groups[0]["lr"] for o in st.optimizers]
    # captured at step 2 (after 2 warm-up steps), again at 3 and 5 (the lr milestones)
    assert graphed.captures == 3 and graphed.eager_steps == 2
    assert eager.objectives[1].pop_stats() == st.objectives[1].pop_stats()


def test_a_divergence_is_recorded_at_its_step_and_freezing_recaptures(float64_default):
    objs = [CrossEntropy(), CapturableNaN(4), CrossEntropy()]
    _, st = make_pack(objs, milestones=())
    graphed = GraphedStep(st, warmup=1, make_graph=StandIn)
    with labels_checked():
        for t, (x, y) in enumerate(data(6)):
            graphed.step(x, y, t)
            if t == 5:
                assert st.poll() == [1]
    assert st.divergences[1].step == 5 and st.divergences[1].reason == "loss is nan"
    assert graphed.captures == 1
    with labels_checked():
        x, y = data(1)[0]
        out = graphed.step(x, y, 6)
    assert graphed.captures == 2 and torch.isnan(out.losses[1]) and torch.isfinite(out.losses[[0, 2]]).all()


@pytest.mark.parametrize("what", ["f1_lp", "masked_auc", "not_sync_free", "adam"])
def test_packs_that_cannot_be_captured_are_refused_with_the_reason(compose_cfg, what):
    from lpmetrics.run.builders import instantiate_runtime
    objs = objectives()
    if what == "f1_lp":   # a general LP: its solver decides on the host
        objs[0] = instantiate_runtime(compose_cfg(["objective=f1_lp"]).objective, pos_ratio=0.5,
                                      num_classes=2, class_counts=[5, 5])
    if what == "masked_auc":
        objs[1] = AUCLoss(solver={"capture_safe": True})
    _, st = make_pack(objs)
    if what == "not_sync_free":
        st.sync_free = False
    if what == "adam":
        st.optimizers[2] = torch.optim.Adam(copy.copy(st.optimizers[2].param_groups[0]["params"]))
    why = capturable(st)
    expected = {"f1_lp": "is not capturable", "masked_auc": "AUCLoss is not capturable",
                "not_sync_free": "not sync-free", "adam": "Adam is neither plain torch.optim.SGD"}[what]
    assert expected in why
    with pytest.raises(ValueError, match="cannot be captured"):
        GraphedStep(st)


def test_launcher_with_graph_replay_writes_the_eager_metrics(compose_cfg, tmp_path, monkeypatch, caplog):
    """The launcher around a GraphedStep (stand-in graph): the same metrics.csv as eager packs,
    with an lr milestone inside the run; on the CPU, cuda_graph=True itself falls back and says so."""
    import pandas as pd

    import lpmetrics.packed.launch as launch
    short = ["dataset=digits", "trainer.max_steps=8", "trainer.eval_every=4", "scheduler.milestones=[5]"]
    specs = {"ce": [], "auc": ["objective=auc_lp_capture", "objective.epsilon=0.5"]}

    def jobs(tag):
        return [launch.Job(compose_cfg([*short, *o]), tmp_path / tag / k, name=k) for k, o in specs.items()]

    launch.train_packed(jobs("eager"), sync_free=True)
    launch.train_packed(jobs("fallback"), sync_free=True, cuda_graph=True)
    assert "no CUDA graph (not on CUDA)" in caplog.text
    made = []
    monkeypatch.setattr(launch, "step_runner", lambda st, *_: made.append(GraphedStep(st, 2, StandIn)) or made[-1])
    launch.train_packed(jobs("graph"), sync_free=True)
    assert made and made[0].captures == 2   # after the warm-up, and at the milestone
    for k in specs:
        eager = pd.read_csv(tmp_path / "eager" / k / "metrics.csv")
        for tag in ("fallback", "graph"):
            pd.testing.assert_frame_equal(eager, pd.read_csv(tmp_path / tag / k / "metrics.csv"), check_exact=True)


def test_no_capture_without_a_warm_up_step_and_hyperparameters_key_the_graph(float64_default):
    _, st = make_pack(objectives())
    with pytest.raises(ValueError, match="warmup=0"):
        GraphedStep(st, warmup=0)
    graphed = GraphedStep(st, warmup=1, make_graph=StandIn)
    key = graphed._key()
    st.optimizers[0].param_groups[0]["momentum"] = 0.5   # e.g. a cyclic momentum schedule
    assert graphed._key() != key


def test_the_probe_times_the_replays_of_a_graphed_pack_and_nothing_else():
    """``packed.speed.runner_ms`` (the campaign's probe, ``gpu_tables.measure``): the warm-up
    steps and the capture happen before the timing, so every timed call is a replay; the step
    number counts up as in training (PPD's stage ends are keyed on it)."""
    from lpmetrics.packed.launch import step_runner
    from lpmetrics.packed.speed import build_runs, runner_ms
    runs = build_runs(lambda: MLP(2, SHAPE, hidden=[8]), SHAPE, 6, 2, sync_free=True)
    replays, seen = [], []

    class Counting(StandIn):
        def replay(self):
            replays.append(1)
            super().replay()
    graphed = GraphedStep(runs.stepper, warmup=2, make_graph=Counting)
    inner = graphed.step
    graphed.step = lambda x, y, step: seen.append(step) or inner(x, y, step)
    runner_ms(runs, graphed, reps=5)
    assert graphed.eager_steps == 2 and graphed.captures == 1
    assert len(replays) == 1 + 5 and seen == list(range(8))   # the capture's step, then 5 timed replays
    # on the CPU the launcher (and so the probe) steps eagerly even when a graph is asked for
    assert step_runner(runs.stepper, True, torch.device("cpu"), 2) is runs.stepper
