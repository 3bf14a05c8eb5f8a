"""make_tables: a CPU run and a GPU run of one protocol share a cell, and the table says which
devices and precisions a cell's runs used wherever one of them is not a GPU in fp32."""
from __future__ import annotations

import json
from pathlib import Path

from scripts.tables import make_tables
from tests.test_make_tables import fake_run

H100, EPYC = "NVIDIA H100 80GB HBM3", "AMD EPYC"


def ran_on(folder: Path, device: str, name: str | None = None, precision: str | None = None,
           config_conv_impl: str | None = None, **record) -> Path:
    """Give a fake run the device records train.py writes (results.json ``device`` and
    ``provenance.device_name``; the config's precision and conv_impl) and ``record`` (``conv_impl``:
    what ``model.conv_impl`` resolved to, as run.job writes it)."""
    path = folder / "results.json"
    res = json.loads(path.read_text())
    res["device"] = device
    res["provenance"] = {"device_name": name, "git_commit": "abc1234"}
    if precision:
        res["config"]["trainer"]["precision"] = precision
    if config_conv_impl:
        res["config"]["model"]["conv_impl"] = config_conv_impl
    res.update(record)
    path.write_text(json.dumps(res))
    return folder


def markdown(capsys, folder: Path) -> list[str]:
    make_tables.main([str(folder), "--table", "binary", "--no-queue"])
    return capsys.readouterr().out.splitlines()


def test_a_cpu_and_a_gpu_run_of_one_protocol_share_a_cell_and_the_footnote_names_both(tmp_path, capsys):
    ran_on(fake_run(tmp_path / "gpu", seed=0, test=0.70), "cuda", H100, config_conv_impl="auto")
    ran_on(fake_run(tmp_path / "cpu", seed=1, test=0.74), "cpu", EPYC, config_conv_impl="gemm")
    lines = markdown(capsys, tmp_path)
    assert "| auc_lp | 72.0 ± 2.8 (n=2) [paper 72.5] |" in lines   # one cell, one row: no split key
    assert lines[-2] == "code versions: abc1234(2 runs)."
    assert lines[-1] == ("runs not on a GPU in fp32 (device, precision): cpu fp32, gemm convolutions + "
                         f"cuda fp32: every cell (models: cpu {EPYC}; cuda {H100}).")


def test_gpu_fp32_runs_add_no_line(tmp_path, capsys):
    for seed in (0, 1):
        ran_on(fake_run(tmp_path / f"gpu{seed}", seed=seed), "cuda:0", H100, precision="fp32", config_conv_impl="stock")
    assert markdown(capsys, tmp_path)[-1] == "code versions: abc1234(2 runs)."


def test_the_conv_record_names_the_path_and_precision_and_only_its_cell_is_listed(tmp_path, capsys):
    ran_on(fake_run(tmp_path / "lp", seed=0), "cuda", H100)
    ran_on(fake_run(tmp_path / "ce", objective="ce", seed=0), "cpu", None, config_conv_impl="auto",
           conv_impl={"impl": "gemm", "requested": "auto", "precision": "bf16", "why": "gated, faster"})
    ran_on(fake_run(tmp_path / "ppd_bf16", objective="ppd_sg", dataset="catdog", seed=0), "cuda", H100,
           precision="bf16")
    assert markdown(capsys, tmp_path)[-1] == (
        "runs not on a GPU in fp32 (device, precision): cpu bf16, gemm convolutions: ce @ cifar10 0.1; "
        f"cuda bf16: ppd_sg @ catdog 0.1 (models: cpu unrecorded; cuda {H100}).")


def test_the_latex_caption_carries_the_footnote(tmp_path, capsys):
    ran_on(fake_run(tmp_path / "cpu", seed=0), "cpu", EPYC)
    make_tables.main([str(tmp_path), "--format", "latex", "--no-queue"])
    assert "runs not on a GPU in fp32 (device, precision): cpu fp32: every cell" in capsys.readouterr().out


def test_conv_impl_is_no_part_of_a_protocol():
    config = {"seed": 0, "model": {"_target_": "models.resnet.resnet18", "cifar_stem": False},
              "trainer": {"max_steps": 40000}}
    with_gemm = json.loads(json.dumps(config))
    with_gemm["model"]["conv_impl"] = "gemm"
    assert make_tables.protocol(with_gemm) == make_tables.protocol(config)
    assert "model.conv_impl" in make_tables.IGNORED


def test_a_compiled_optimizer_step_is_named_and_no_part_of_a_protocol(tmp_path, capsys):
    ran_on(fake_run(tmp_path / "eager", seed=0), "cpu", EPYC,
           optimizer_impl={"requested": "eager", "impl": "eager", "optimizer": "SGD"})
    ran_on(fake_run(tmp_path / "compiled", seed=1), "cpu", EPYC,
           optimizer_impl={"requested": "compiled", "impl": "compiled", "optimizer": "SGD"})
    lines = markdown(capsys, tmp_path)
    assert any(line.startswith("| auc_lp |") and "(n=2)" in line for line in lines)
    assert lines[-1] == ("runs not on a GPU in fp32 (device, precision): cpu fp32 + cpu fp32, compiled "
                         f"optimizer step: every cell (models: cpu {EPYC}).")
    config = {"seed": 0, "trainer": {"max_steps": 40000, "optimizer_impl": "compiled"}}
    assert make_tables.protocol(config) == make_tables.protocol({"seed": 0, "trainer": {"max_steps": 40000}})
