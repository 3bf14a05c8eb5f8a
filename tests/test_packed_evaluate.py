"""A pack's evaluation in one pass (:mod:`packed.evaluate`) equals per-run evaluation.

Oracles: :func:`builders.predict` on each run's own model (the logits, bit for bit on the CPU's
``loop`` forward in float64 and float32, both BatchNorm modes, a last batch of one joined to the
one before; the ``vmap`` forward to 1e-12 in float64), and the packed launcher with
``batched_eval=False`` (each run's ``metrics.csv`` identical byte for byte, and its checkpoints'
weights, for ``trainer.eval_bn=eval`` and ``=train``; digits with an MLP that has a BatchNorm
layer, so the two modes differ). Also: runs whose evaluation settings differ from the pack's
evaluate alone, and a batched pass that runs out of memory falls back to per-run evaluation.
"""
from __future__ import annotations

import copy
import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from lpmetrics.packed import evaluate as pack_eval
from lpmetrics.packed import pack
from lpmetrics.packed.evaluate import PackEvaluator, pack_predict
from lpmetrics.packed.launch import Job, train_packed
from lpmetrics.run import evaluation
from lpmetrics.run.builders import predict
from tests.test_eval_both_bn import BN_MLP, bn_mlp, composed


class Rows:
    """A split of feature rows in any dtype, gathered as the project's datasets gather."""

    def __init__(self, n: int, dim: int, seed: int, dtype: torch.dtype, device: str = "cpu") -> None:
        g = torch.Generator().manual_seed(seed)
        self.device = torch.device(device)
        self.features = torch.randn(n, dim, generator=g, dtype=dtype).to(device)
        self.labels = (torch.arange(n) % 2).numpy()

    def __len__(self) -> int:
        return len(self.labels)

    def batch(self, idx, aug=None):
        return self.features[idx], torch.as_tensor(self.labels, device=self.device)[idx]


def trained_bn_pack(n: int, dtype: torch.dtype, mode: str = "loop", device: str = "cpu"):
    """``n`` BatchNorm MLPs with their own weights and running statistics (a few train-mode
    forwards), packed."""
    models = []
    for i in range(n):
        torch.manual_seed(i)
        model = bn_mlp(2, [6], hidden=[16]).to(dtype)
        with torch.no_grad():
            for _ in range(3):
                model(torch.randn(20, 6, dtype=dtype) * (i + 1) + i)
        models.append(model.to(device))
    return pack(models, mode)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("bn_mode", ["eval", "train"])
def test_pack_predict_equals_predict_row_by_row(dtype, bn_mode):
    """37 items in batches of 12: BN-train mode joins the last item to the batch before."""
    packed = trained_bn_pack(3, dtype)
    data = [Rows(37, 6, seed=10 + i, dtype=dtype) for i in range(3)]
    buffers = {k: v.clone() for k, v in packed.buffers.items()}
    rng = torch.get_rng_state()
    got = pack_predict(packed, data, batch_size=12, bn_mode=bn_mode)
    assert torch.equal(rng, torch.get_rng_state()) and packed.training
    assert all(torch.equal(buffers[k], v) for k, v in packed.buffers.items())   # running stats untouched
    for i, (logits, labels) in enumerate(got):
        want_logits, want_labels = predict(packed.models[i], data[i], batch_size=12, bn_mode=bn_mode)
        assert logits.dtype == np.float32 and np.array_equal(labels, want_labels)
        assert np.array_equal(logits, want_logits), f"run {i}: {np.abs(logits - want_logits).max()}"
    if bn_mode == "train":   # the modes do differ on these models
        assert not np.array_equal(got[0][0], pack_predict(packed, data, batch_size=12)[0][0])


@pytest.mark.parametrize("bn_mode", ["eval", "train"])
def test_the_vmap_forward_agrees_to_1e_12_in_float64(float64_default, bn_mode):
    """The GPU's forward (vmap: grouped kernels) in the evaluation's modes, on the CPU, before
    predict's float32 cast (which would hide the difference)."""
    packed = trained_bn_pack(3, torch.float64, mode="vmap")
    buffers = {k: v.clone() for k, v in packed.buffers.items()}
    x = torch.randn(3, 12, 6)
    with torch.no_grad(), pack_eval._mode(packed, bn_mode):
        got = packed(x)
    assert all(torch.equal(buffers[k], v) for k, v in packed.buffers.items())
    for i in range(3):
        net = copy.deepcopy(packed.models[i]).train(bn_mode == "train")
        with torch.no_grad():
            assert float((got[i] - net(x[i])).abs().max()) <= 1e-12


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the pack's CUDA forward needs CUDA")
@pytest.mark.parametrize("bn_mode", ["eval", "train"])
def test_pack_predict_on_cuda_agrees_with_predict(bn_mode):
    """float32 on CUDA (the vmap forward: batched matmuls where each run alone calls its own
    GEMM): the logits agree to float32 rounding; prints the measured difference (run with -s)."""
    packed = trained_bn_pack(3, torch.float32, mode="auto", device="cuda")
    data = [Rows(300, 6, seed=10 + i, dtype=torch.float32, device="cuda") for i in range(3)]
    got = pack_predict(packed, data, batch_size=128, device="cuda", bn_mode=bn_mode)
    worst = max(float(np.abs(z - predict(packed.models[i], data[i], batch_size=128, device="cuda",
                                         bn_mode=bn_mode)[0]).max()) for i, (z, _) in enumerate(got))
    print(f"pack_predict vs predict on CUDA, {bn_mode} mode: max |logit difference| = {worst:.3g}")
    assert worst <= 1e-4


def test_pack_predict_refuses_mismatched_splits():
    packed = trained_bn_pack(2, torch.float32)
    with pytest.raises(ValueError, match="one dataset per run"):
        pack_predict(packed, [Rows(10, 6, 0, torch.float32)])
    with pytest.raises(ValueError, match="differ in length"):
        pack_predict(packed, [Rows(10, 6, 0, torch.float32), Rows(11, 6, 1, torch.float32)])
    with pytest.raises(ValueError, match="bn_mode must be one of"):
        pack_predict(packed, [Rows(10, 6, 0, torch.float32)] * 2, bn_mode="none")


SHORT = ["dataset=digits", *BN_MLP, "trainer.max_steps=6", "trainer.eval_every=3", "trainer.batch_size=32",
         "device=cpu", "logger=csv", "trainer.eval_batch_size=100"]
PACK = [["seed=0", "optimizer.lr=0.1"], ["seed=1", "optimizer.lr=0.05"], ["seed=2", "optimizer.lr=0.1",
                                                                           "objective=auc_lp"]]


def launched(tmp_path, name: str, extra=(), runs=PACK, **kw):
    cfgs = [composed([*SHORT, *extra, *r]) for r in runs]
    outcomes = train_packed([Job(c, tmp_path / name / f"r{i}", name=f"r{i}") for i, c in enumerate(cfgs)], **kw)
    assert all(o["packed"]["size"] == len(runs) and o["diverged"] is None for o in outcomes), outcomes
    return outcomes


def assert_same_runs(tmp_path, a: str, b: str, n: int) -> None:
    """Each run's metrics.csv identical byte for byte; its last.pt / best.pt weights equal."""
    for i in range(n):
        da, db = tmp_path / a / f"r{i}", tmp_path / b / f"r{i}"
        assert (da / "metrics.csv").read_text() == (db / "metrics.csv").read_text(), i
        for ckpt in ("last.pt", "best.pt"):
            ma, mb = (torch.load(d / ckpt, weights_only=False)["model"] for d in (da, db))
            assert all(torch.equal(ma[k], mb[k]) for k in mb), (i, ckpt)


@pytest.mark.parametrize("eval_bn", ["eval", "train"])
def test_batched_evaluation_writes_the_rows_of_per_run_evaluation(tmp_path, eval_bn):
    """ce and auc_lp runs of other seeds and lrs; every predict call of every evaluation (val,
    test, test in the other BatchNorm mode) served from the pack."""
    extra = [f"trainer.eval_bn={eval_bn}"]
    batched = launched(tmp_path, "batched", extra)
    launched(tmp_path, "alone", extra, batched_eval=False)
    assert_same_runs(tmp_path, "batched", "alone", len(PACK))
    record = batched[0]["packed"]["evaluation"]
    assert record == {"note": "batched", "batched_predicts": 3 * 3 * 2, "per_run_predicts": 0}
    other = "bneval" if eval_bn == "train" else "bntrain"
    assert f"test_{other}_auc" in batched[0]["final"]
    on_disk = json.loads((tmp_path / "alone" / "r0" / "results.json").read_text())
    assert on_disk["packed"]["evaluation"]["batched_predicts"] == 0


def test_runs_with_other_eval_settings_evaluate_alone_and_oom_falls_back(tmp_path, monkeypatch):
    """A fourth run with another eval batch size: its val and test evaluations run alone, its
    BN-train test pass (batches of 32, as the others') joins theirs; same rows either way. Then a
    pass that runs out of memory: per-run evaluation from then on."""
    runs = [*PACK, ["seed=3", "trainer.eval_batch_size=50"]]
    mixed = launched(tmp_path, "mixed", runs=runs)
    launched(tmp_path, "alone", runs=runs, batched_eval=False)
    assert_same_runs(tmp_path, "mixed", "alone", len(runs))
    assert mixed[0]["packed"]["evaluation"]["batched_predicts"] == (3 * 3 + 1) * 2   # 2 evaluations
    assert mixed[0]["packed"]["evaluation"]["per_run_predicts"] == 2 * 2

    def out_of_memory(*args, **kw):
        raise torch.OutOfMemoryError("CUDA out of memory (a stand-in)")

    monkeypatch.setattr(pack_eval, "pack_predict", out_of_memory)
    oom = launched(tmp_path, "oom", runs=PACK)
    assert_same_runs(tmp_path, "oom", "mixed", len(PACK))   # the same three runs
    assert oom[0]["packed"]["evaluation"]["note"].startswith("per-run (the batched pass failed: OutOfMemoryError")
    assert oom[0]["packed"]["evaluation"]["batched_predicts"] == 0


def test_the_evaluator_asks_what_train_evaluate_asks(monkeypatch):
    """:func:`packed.evaluate.requests` lists exactly the predict calls evaluation.evaluate makes (if
    they drifted apart, the calls would silently go per run)."""
    packed = trained_bn_pack(2, torch.float32)
    bundle = SimpleNamespace(val=Rows(20, 6, 0, torch.float32), test=Rows(30, 6, 1, torch.float32), task="binary")
    names = {id(bundle.val): "val", id(bundle.test): "test"}
    calls = []

    def recorded(model, data, *, batch_size, device, bn_mode):
        calls.append((names[id(data)], bn_mode, batch_size))
        return predict(model, data, batch_size=batch_size, device=device, bn_mode=bn_mode)

    monkeypatch.setattr(evaluation, "predict", recorded)
    for eval_bn in ("eval", "train"):
        run = SimpleNamespace(cfg=composed([*SHORT, f"trainer.eval_bn={eval_bn}"]), bundle=bundle,
                              eval_splits=("val", "test"))
        calls.clear()
        for split in run.eval_splits:
            evaluation.evaluate(packed.models[0], bundle, split, run.cfg, "cpu")
        assert calls == pack_eval.requests(run), eval_bn
    assert PackEvaluator(packed, "cpu").no_bn_train == ""
