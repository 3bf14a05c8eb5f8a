"""eval.py on a tiny fake run folder (digits + MLP), built here so that it needs no train.py."""
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf


import eval as ev  # noqa: E402
from lpmetrics import metrics  # noqa: E402
from lpmetrics.run.builders import build_model  # noqa: E402
from lpmetrics.data import build_data  # noqa: E402

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _config(task: str) -> dict:
    dataset = OmegaConf.load(CONFIGS / "dataset" / "digits.yaml")
    dataset.pop("defaults", None)
    dataset.task = task
    model = OmegaConf.load(CONFIGS / "model" / "mlp.yaml")
    model.hidden = [32]
    cfg = OmegaConf.create({"seed": 0, "dataset": dataset, "model": model,
                            "trainer": {"eval_batch_size": 100}})  # batches != split size
    return OmegaConf.to_container(cfg, resolve=True)


def _make_run(root: Path, task: str, steps: int = 80) -> tuple[Path, dict]:
    """A run folder as train.py writes it: .hydra/config.yaml, last.pt (trained a little), best.pt
    (the initial weights, at step 0)."""
    cfg_dict = _config(task)
    cfg = OmegaConf.create(cfg_dict)
    torch.manual_seed(0)
    bundle = build_data(cfg.dataset, seed=cfg.seed)
    model = build_model(cfg, bundle)
    run = root / f"run_{task}"
    (run / ".hydra").mkdir(parents=True)
    OmegaConf.save(cfg, run / ".hydra" / "config.yaml")
    torch.save({"step": 0, "model": model.state_dict(), "config": cfg_dict}, run / "best.pt")
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    x, y = bundle.train.features, torch.as_tensor(bundle.train.labels)
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    torch.save({"step": steps, "model": model.state_dict(), "optimizer": opt.state_dict(),
                "config": cfg_dict}, run / "last.pt")
    return run, {"model": model.eval(), "bundle": bundle}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    return {task: _make_run(root, task) for task in ("binary", "multiclass")}


def _direct_metrics(made, split="test"):
    """Logits from one full-batch forward pass (no DataLoader), scored by metrics.evaluate."""
    ds = getattr(made["bundle"], split)
    with torch.no_grad():
        logits = made["model"](ds.features).numpy()
    return metrics.evaluate(ds.labels, logits, made["bundle"].task)


def test_binary_run(runs):
    run, made = runs["binary"]
    record = ev.evaluate_run(run, device="cpu")
    assert json.loads((run / "eval_test.json").read_text()) == record
    assert record["step"] == 80 and record["split"] == "test" and record["task"] == "binary"
    assert record["num_samples"] == len(made["bundle"].test)
    assert set(record["metrics"]) == {"auc", "ap", "f1", "acc", "mcc", "jaccard", "eer"}
    assert record["metrics"] == pytest.approx(_direct_metrics(made), abs=1e-6)
    assert record["metrics"]["auc"] > 0.9  # a trained model: labels and logits line up
    assert (run / "roc_test.png").read_bytes()[:8] == PNG_MAGIC
    curves = np.load(run / "roc_test.npz")
    assert np.trapezoid(curves["tpr_positive"], curves["fpr_positive"]) == pytest.approx(
        record["metrics"]["auc"], abs=1e-6)


def test_multiclass_run(runs):
    run, made = runs["multiclass"]
    record = ev.evaluate_run(run, device="cpu")
    assert set(record["metrics"]) == {"auc_mu", "auc_ova", "acc"}
    assert record["metrics"] == pytest.approx(_direct_metrics(made), abs=1e-6)
    per_class = record["auc_ova_per_class"]
    assert len(per_class) == 3 and np.mean(per_class) == pytest.approx(record["metrics"]["auc_ova"])
    for k in range(3):
        assert (run / f"roc_test_class{k}.png").read_bytes()[:8] == PNG_MAGIC
    assert sorted(np.load(run / "roc_test.npz").files) == sorted(
        f"{a}_class{k}" for a in ("fpr", "tpr") for k in range(3))


def test_cli_checkpoint_split_and_out(runs, tmp_path):
    run, made = runs["binary"]
    out = tmp_path / "ev"
    record = ev.main([str(run), "--checkpoint", "best.pt", "--split", "val", "--out", str(out),
                      "--device", "cpu"])
    assert record["step"] == 0 and record["split"] == "val"
    assert (out / "eval_val.json").is_file() and (out / "roc_val.png").is_file()
    assert not (run / "eval_val.json").exists()
    made_init = {"model": build_model(OmegaConf.create(_config("binary")), made["bundle"]),
                 "bundle": made["bundle"]}
    made_init["model"].load_state_dict(torch.load(run / "best.pt", weights_only=False)["model"])
    made_init["model"].eval()
    assert record["metrics"] == pytest.approx(_direct_metrics(made_init, split="val"), abs=1e-6)


def test_checkpoint_without_config_uses_hydra_yaml(runs, tmp_path):
    run, made = runs["binary"]
    ckpt = torch.load(run / "last.pt", weights_only=False)
    del ckpt["config"]
    torch.save(ckpt, run / "noconf.pt")
    record = ev.evaluate_run(run, checkpoint=run / "noconf.pt", out_dir=tmp_path, device="cpu")
    assert record["metrics"] == pytest.approx(_direct_metrics(made), abs=1e-6)
    with pytest.raises(FileNotFoundError, match="holds no 'config'"):
        ev.evaluate_run(None, checkpoint=run / "noconf.pt", out_dir=tmp_path, device="cpu")


def test_missing_checkpoint_is_actionable(tmp_path):
    with pytest.raises(FileNotFoundError, match="no last.pt .* pass --checkpoint"):
        ev.evaluate_run(tmp_path, device="cpu")
    with pytest.raises(ValueError, match="split"):
        ev.evaluate_run(tmp_path, split="train")


def test_predict_bn_train_mode_uses_batch_statistics_and_leaves_model_untouched():
    """bn_mode="train" (the authors' evaluation) equals normalising each eval batch (in a fixed
    shuffled order, outputs back in split order) by its own mean/var (a hand-written BatchNorm),
    and changes neither the running stats nor the mode."""
    from torch.utils.data import TensorDataset

    from lpmetrics.run.builders import predict

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2))
    net.train()
    for _ in range(3):  # give the running statistics values far from any batch's
        net(torch.randn(32, 5) * 3 + 2)
    before = {k: v.clone() for k, v in net.state_dict().items()}
    x, y = torch.randn(40, 5), torch.randint(0, 2, (40,))
    ds = TensorDataset(x, y)
    out_eval, _ = predict(net, ds, batch_size=16)
    out_train, labels = predict(net, ds, batch_size=16, bn_mode="train")
    assert net.training and all(torch.equal(v, net.state_dict()[k]) for k, v in before.items())
    lin1, bn, lin2 = net
    order = torch.randperm(40, generator=torch.Generator().manual_seed(0))  # class-mixed batches
    expected = torch.empty(40, 2)
    for idx in order.split(16):
        h = lin1(x[idx])
        h = (h - h.mean(0)) / torch.sqrt(h.var(0, unbiased=False) + bn.eps) * bn.weight + bn.bias
        expected[idx] = lin2(h).detach()
    np.testing.assert_allclose(out_train, expected.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(labels, y.numpy())
    assert np.abs(out_eval - out_train).max() > 0.1    # the two modes really differ here
    with pytest.raises(ValueError, match="bn_mode must be one of"):
        predict(net, ds, bn_mode="batch")


def test_predict_bn_train_mode_folds_a_last_batch_of_one_sample():
    """41 samples in batches of 8 leave one sample alone: BatchNorm cannot normalise it by its own
    statistics (ResNet-18's last stage is 1x1 on 32x32 inputs and raised), so it joins the batch
    before it; the result equals normalising the last 9 samples together."""
    from torch.utils.data import TensorDataset

    from lpmetrics.run.builders import predict

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2))
    x, y = torch.randn(41, 5), torch.randint(0, 2, (41,))
    out, labels = predict(net, TensorDataset(x, y), batch_size=8, bn_mode="train")
    order = torch.randperm(41, generator=torch.Generator().manual_seed(0))
    last = order[32:]                                   # 8 + the lone 41st sample
    lin1, bn, lin2 = net
    h = lin1(x[last])
    h = (h - h.mean(0)) / torch.sqrt(h.var(0, unbiased=False) + bn.eps) * bn.weight + bn.bias
    np.testing.assert_allclose(out[last.numpy()], lin2(h).detach().numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(labels, y.numpy())


def test_cli_bn_mode_train_writes_suffixed_record(runs, tmp_path):
    run = runs["binary"][0]
    record = ev.main([str(run), "--bn-mode", "train", "--batch-size", "32", "--out", str(tmp_path)])
    assert record["bn_mode"] == "train" and record["batch_size"] == 32 and (tmp_path / "eval_test_bntrain.json").is_file()
    assert (tmp_path / "roc_test_bntrain.png").is_file() and not (tmp_path / "eval_test.json").exists()
