"""scripts/tables/make_tables.py on hand-made run folders: which runs share a cell, which lr is reported,
what the three output formats print, and what it says about runs it cannot place."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from scripts.tables import make_tables
from scripts.tables.paper_numbers import PAPER

ROOT = Path(__file__).resolve().parents[1]


def fake_run(folder: Path, *, objective="auc_lp", dataset="cifar10", level=0.1, seed=0, lr=0.1, test=0.70,
             val=None, metric="auc", steps=200, final_step=None, task="binary", **objective_keys) -> Path:
    """A run folder shaped like train.py's: resolved config, Hydra choices, final metrics."""
    config = {
        "seed": seed, "device": "cuda" if seed % 2 else "cpu", "resume": False,  # ignored keys vary
        "trainer": {"max_steps": steps, "batch_size": 64, "eval_every": 100, "eval_batch_size": 512,
                    "log_every": 50},
        "dataset": {"name": dataset, "root": f"data_copy_{seed}", "task": task, "cache_dir": None,
                    "neg_keep": level if task == "binary" else 1.0,
                    "drop_rate": level if task == "multiclass" else 0.0},
        "model": {"_target_": "models.resnet.resnet18", "cifar_stem": False},
        "optimizer": {"_target_": "torch.optim.SGD", "lr": lr, "momentum": 0.9},
        "objective": {"_target_": f"objectives.fake.{objective}", "epsilon": 0.01, **objective_keys},
        "logger": {"_target_": "loggers.CSVLogger" if seed % 2 else "loggers.WandbLogger"},
    }
    final = {"step": final_step or steps, f"test_{metric}": test, f"val_{metric}": test if val is None else val}
    folder.mkdir(parents=True)
    (folder / "results.json").write_text(json.dumps(
        {"final": final, "best_val": final, "choices": {"objective": objective, "dataset": dataset}, "config": config}))
    (folder / "metrics.csv").write_text(",".join(final) + "\n" + ",".join(map(str, final.values())) + "\n")
    return folder


def table(capsys, *args) -> tuple[list[str], str]:
    """Markdown lines without the code-versions footer (tested on its own), and stderr."""
    make_tables.main([str(a) for a in args])
    out = capsys.readouterr()
    return strip_footer(out.out.splitlines()), out.err


def strip_footer(lines: list[str]) -> list[str]:
    if len(lines) > 2 and lines[-2] == "" and lines[-1].startswith("code versions: "):
        return lines[:-2]
    return lines


def test_seeds_pool_into_one_cell_with_mean_std_n(tmp_path, capsys):
    for seed, auc in enumerate([0.70, 0.72, 0.74]):
        fake_run(tmp_path / f"lp{seed}", seed=seed, test=auc)
    fake_run(tmp_path / "ce0", objective="ce", seed=0, test=0.60)
    fake_run(tmp_path / "ce1", objective="ce", seed=1, test=0.70)
    lines, err = table(capsys, tmp_path)
    assert lines[-3:] == ["|---|---:|",  # the paper's row order: cross-entropy first
                          "| ce | 65.0 ± 7.1 (n=2) [paper 65.2] |",
                          "| auc_lp | 72.0 ± 2.0 (n=3) [paper 72.5] |"]
    assert "Step 200." in lines and "| objective | cifar10 0.1 |" in lines
    assert "lr 0.1 (--lr-rule per-cell: best mean val_auc per cell)." in lines
    assert "placed 5 of 5 usable runs in 2 cells" in err and "differ" not in err


def _lr_sweep(root: Path) -> None:
    """cifar10 0.1: val prefers lr 0.1 (test prefers 0.01); cifar10 0.2: val prefers lr 0.01.
    Mean val over both cells: lr 0.1 (80 + 60) / 2 = 70, lr 0.01 (70 + 74) / 2 = 72."""
    for level, lr, val, test in [(0.1, 0.1, 0.80, 0.70), (0.1, 0.01, 0.70, 0.75),
                                 (0.2, 0.1, 0.60, 0.61), (0.2, 0.01, 0.74, 0.66)]:
        fake_run(root / f"{level}_{lr}", level=level, lr=lr, val=val, test=test)


def test_lr_per_cell_and_global_pick_different_lrs_on_validation(tmp_path, capsys):
    _lr_sweep(tmp_path)
    lines, err = table(capsys, tmp_path, "--lr-rule", "per-cell")
    assert lines[-1] == "| auc_lp | 70.0 (n=1, lr=0.1) [paper 72.5] | 66.0 (n=1, lr=0.01) [paper 74.4] |"
    assert "lr named in each cell or row (--lr-rule per-cell: best mean val_auc per cell)." in lines
    assert "not selected, other lr: 2 run(s)" in err
    lines, err = table(capsys, tmp_path, "--lr-rule", "global")
    assert lines[-1] == "| auc_lp | 75.0 (n=1) [paper 72.5] | 66.0 (n=1) [paper 74.4] |"
    assert ("lr 0.01 for the whole table (--lr-rule global: best mean val_auc over the 2 cells every lr ran: "
            "lr 0.1 70.00, lr 0.01 72.00).") in lines
    lines, _ = table(capsys, tmp_path, "--lr-rule", "none")
    assert lines[-2:] == ["| auc_lp (optimizer.lr=0.01) | 75.0 (n=1) [paper 72.5] | 66.0 (n=1) [paper 74.4] |",
                          "| auc_lp (optimizer.lr=0.1) | 70.0 (n=1) [paper 72.5] | 61.0 (n=1) [paper 74.4] |"]


def test_lr_selection_uses_the_seed_mean_of_validation(tmp_path, capsys):
    fake_run(tmp_path / "a0", seed=0, lr=0.1, val=0.90, test=0.80)  # best single val run ...
    fake_run(tmp_path / "a1", seed=1, lr=0.1, val=0.50, test=0.60)  # ... but mean val 0.70
    fake_run(tmp_path / "b0", seed=0, lr=0.01, val=0.75, test=0.65)
    fake_run(tmp_path / "b1", seed=1, lr=0.01, val=0.75, test=0.67)
    lines, _ = table(capsys, tmp_path)
    assert lines[-1] == "| auc_lp | 66.0 ± 1.4 (n=2) [paper 72.5] |"
    assert "lr 0.01 (--lr-rule per-cell: best mean val_auc per cell)." in lines


def test_lr_selection_compares_lrs_on_the_seeds_they_share(tmp_path, capsys):
    # seed 0 chose lr 0.1 and only it ran seed 1 (the campaign's order): its two-seed mean (0.70)
    # is below lr 0.01's one seed (0.75), but on the shared seed 0 lr 0.1 is ahead (0.90)
    fake_run(tmp_path / "a0", seed=0, lr=0.1, val=0.90, test=0.80)
    fake_run(tmp_path / "a1", seed=1, lr=0.1, val=0.50, test=0.60)
    fake_run(tmp_path / "b0", seed=0, lr=0.01, val=0.75, test=0.65)
    lines, _ = table(capsys, tmp_path)
    assert lines[-1] == "| auc_lp | 70.0 ± 14.1 (n=2) [paper 72.5] |"
    assert "lr 0.1 (--lr-rule per-cell: best mean val_auc per cell)." in lines


def test_global_rule_reports_cells_without_the_chosen_lr(tmp_path, capsys):
    _lr_sweep(tmp_path)
    fake_run(tmp_path / "ce", objective="ce", lr=0.1, test=0.65)  # ce never ran at 0.01
    lines, err = table(capsys, tmp_path, "--lr-rule", "global")
    assert "not placed, no run at the selected lr 0.01: cells ce @ cifar10 0.1" in err
    assert lines[-2:] == ["|---|---:|---:|", "| auc_lp | 75.0 (n=1) [paper 72.5] | 66.0 (n=1) [paper 74.4] |"]


def test_different_lengths_never_share_a_cell(tmp_path, capsys):
    fake_run(tmp_path / "short", seed=0, steps=200, test=0.60)
    fake_run(tmp_path / "long", seed=1, steps=400, test=0.80)
    lines, err = table(capsys, tmp_path)
    assert lines[-2:] == ["| auc_lp (trainer.max_steps=200) | 60.0 (n=1, step 200) [paper 72.5] |",
                          "| auc_lp (trainer.max_steps=400) | 80.0 (n=1, step 400) [paper 72.5] |"]
    assert "Steps differ: each cell names its step." in lines
    assert "auc_lp: runs differ in trainer.max_steps: one row per value" in err


def test_same_budget_but_different_final_step_never_share_a_cell(tmp_path, capsys):
    fake_run(tmp_path / "stopped", seed=0, steps=200, final_step=100, test=0.60)
    fake_run(tmp_path / "done", seed=1, steps=200, test=0.80)
    lines, _ = table(capsys, tmp_path)
    assert lines[-2:] == ["| auc_lp (step=100) | 60.0 (n=1, step 100) [paper 72.5] |",
                          "| auc_lp (step=200) | 80.0 (n=1, step 200) [paper 72.5] |"]


def test_a_run_whose_config_lacks_max_steps_gets_its_own_row(tmp_path, capsys):
    """An older run without trainer.max_steps in its config (a missing key counts as null) used to
    crash the row labelling with KeyError."""
    fake_run(tmp_path / "new", seed=0, steps=200, test=0.60)
    old = fake_run(tmp_path / "old", seed=1, steps=400, test=0.80)
    res = json.loads((old / "results.json").read_text())
    del res["config"]["trainer"]["max_steps"]
    (old / "results.json").write_text(json.dumps(res))
    lines, _ = table(capsys, tmp_path)
    assert lines[-2:] == ["| auc_lp (step=200, trainer.max_steps=200) | 60.0 (n=1, step 200) [paper 72.5] |",
                          "| auc_lp (step=400, trainer.max_steps=None) | 80.0 (n=1, step 400) [paper 72.5] |"]


def _eps_sweep(root: Path) -> None:
    for eps, aucs in [(0.1, [0.70, 0.72]), (0.01, [0.78, 0.80])]:
        for seed, auc in enumerate(aucs):
            fake_run(root / f"eps{eps}_{seed}", dataset="catdog", seed=seed, test=auc, epsilon=eps)


def test_different_epsilon_are_separate_rows(tmp_path, capsys):
    _eps_sweep(tmp_path)
    lines, err = table(capsys, tmp_path, "--table", "binary")
    assert lines[-2:] == ["| auc_lp (objective.epsilon=0.01) | 79.0 ± 1.4 (n=2) [paper 78.6] |",
                          "| auc_lp (objective.epsilon=0.1) | 71.0 ± 1.4 (n=2) [paper 78.6] |"]
    assert "auc_lp: runs differ in objective.epsilon: one row per value" in err


def test_eps_table_puts_epsilon_in_the_columns(tmp_path, capsys):
    _eps_sweep(tmp_path)
    lines, _ = table(capsys, tmp_path, "--table", "eps")
    assert lines[-3:] == ["| objective | eps=0.1 | eps=0.01 |", "|---|---:|---:|",
                          "| auc_lp · catdog 0.1 | 71.0 ± 1.4 (n=2) [paper 71.3] | 79.0 ± 1.4 (n=2) [paper 78.6] |"]


def test_multiclass_columns_in_paper_order_with_auc_mu_numbers(tmp_path, capsys):
    for level, auc in [(0.0, 0.85), (0.9, 0.75)]:
        fake_run(tmp_path / f"mu{level}", objective="auc_mu_lp", dataset="stl10", task="multiclass",
                 level=level, metric="auc_mu", test=auc)
    fake_run(tmp_path / "binary", test=0.7)
    lines, err = table(capsys, tmp_path, "--table", "multiclass_mu")
    assert lines[-3:] == ["| objective | stl10 0.9 | stl10 0 |", "|---|---:|---:|",
                          "| auc_mu_lp | 75.0 (n=1) [paper 76.1] | 85.0 (n=1) [paper 84.5] |"]
    assert "not placed, task=binary, this table is task=multiclass: 1 run(s)" in err


def test_csv_one_row_per_cell(tmp_path, capsys):
    _lr_sweep(tmp_path)
    fake_run(tmp_path / "ce0", objective="ce", seed=0, test=0.60)
    fake_run(tmp_path / "ce1", objective="ce", seed=1, test=0.70)
    lines, _ = table(capsys, tmp_path, "--format", "csv")
    assert lines == ["dataset,level,objective,selected_lr,n_seeds,mean,std,paper,step,val_mean",
                     "cifar10,0.1,auc_lp,0.1,1,70.0000,,72.5,200,80.0000",
                     "cifar10,0.1,ce,0.1,2,65.0000,7.0711,65.2,200,65.0000",
                     "cifar10,0.2,auc_lp,0.01,1,66.0000,,74.4,200,74.0000"]


def test_latex_table(tmp_path, capsys):
    fake_run(tmp_path / "ce0", objective="ce", seed=0, test=0.60)
    fake_run(tmp_path / "ce1", objective="ce", seed=1, test=0.70)
    fake_run(tmp_path / "lp", test=0.72)
    lines, _ = table(capsys, tmp_path, "--format", "latex")
    assert lines[0] == "\\begin{table}" and lines[1].startswith("\\caption{Test auc in \\% at the final evaluation")
    assert lines[2:] == ["\\begin{tabular}{lr}", "\\toprule", "objective & cifar10 0.1 \\\\", "\\midrule",
                         "ce & 65.0 $\\pm$ 7.1 (n=2) [paper 65.2] \\\\",
                         "auc\\_lp & 72.0 (n=1) [paper 72.5] \\\\",
                         "\\bottomrule", "\\end{tabular}", "\\end{table}"]


def test_runs_it_cannot_place_are_listed(tmp_path, capsys):
    fake_run(tmp_path / "good", test=0.7)
    fake_run(tmp_path / "multi", task="multiclass", level=0.9, metric="auc_ova")
    fake_run(tmp_path / "nof1", metric="auc")  # placed in binary, but the f1 table needs test_f1
    (tmp_path / "crashed").mkdir()
    (tmp_path / "crashed" / "metrics.csv").write_text("step,val_auc\n100,0.6\n")
    lines, err = table(capsys, tmp_path)
    assert "found 3 results.json" in err
    assert f"no results.json (unfinished or still running): 1 run(s): {tmp_path / 'crashed'}" in err
    assert f"task=multiclass, this table is task=binary: 1 run(s): {tmp_path / 'multi'}" in err
    with pytest.raises(SystemExit, match="nothing to place in --table f1"):
        table(capsys, tmp_path, "--table", "f1")
    assert "no test_f1 in final: 2 run(s)" in capsys.readouterr().err


def test_missing_validation_blocks_lr_selection_but_not_rule_none(tmp_path, capsys):
    run = fake_run(tmp_path / "noval", test=0.7)
    res = json.loads((run / "results.json").read_text())
    del res["final"]["val_auc"]
    (run / "results.json").write_text(json.dumps(res))
    with pytest.raises(SystemExit):
        table(capsys, tmp_path)
    assert "no val_auc in final (needed to pick the lr; or use --lr-rule none)" in capsys.readouterr().err
    lines, _ = table(capsys, tmp_path, "--lr-rule", "none")
    assert lines[-1] == "| auc_lp | 70.0 (n=1) [paper 72.5] |"


def test_cli_exits_nonzero_when_nothing_is_found(tmp_path):
    cmd = [sys.executable, "-m", "scripts.tables.make_tables", str(tmp_path)]
    empty = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert empty.returncode == 1 and "found 0 results.json" in empty.stderr and "nothing to place" in empty.stderr
    assert empty.stdout == ""
    fake_run(tmp_path / "lp", test=0.72)
    ok = subprocess.run(cmd + ["--out", str(tmp_path / "t.md")], cwd=ROOT, capture_output=True, text=True, check=True)
    assert strip_footer(ok.stdout.splitlines())[-1] == "| auc_lp | 72.0 (n=1) [paper 72.5] |"
    assert (tmp_path / "t.md").read_text() == ok.stdout


def test_paper_numbers_are_complete_and_consistent():
    assert len(PAPER["binary"]) == 16 and all(len(v) == 4 for v in PAPER["binary"].values())
    assert len(PAPER["multiclass"]) == len(PAPER["multiclass_mu"]) == 8
    assert PAPER["multiclass_mu"][("stl10", 0.9)] == {"ce": 68.9, "auc_ova_lp": 76.1, "auc_mu_lp": 76.1}
    assert PAPER["f1"][("cifar10", 1.0)] == {"ce": 70.3, "f1_cvxpy": 66.6, "f1_apperf": 66.7, "f1_lp_paper": 72.6}
    assert PAPER["accuracy"][("catdog", 1.0)] == {"ce": 76.0, "f1_lp_paper": 77.8, "f1_cvxpy": 70.1}
    # Meng et al., ICLR 2021 version: the ablation's epsilon = 0.01 row is Table 1's "Ours" on
    # Cat&Dog
    for level in (0.1, 0.2, 0.4, 1.0):
        assert PAPER["eps"][("catdog", level, 0.01)]["auc_lp"] == PAPER["binary"][("catdog", level)]["auc_lp"]


def test_a_key_added_later_counts_as_its_old_behaviour_not_as_null(tmp_path, capsys):
    """trainer.eval_bn came after some runs: absent == "eval" (pooled), "train" is its own row."""
    old = fake_run(tmp_path / "old", seed=0, test=0.70)
    for name, seed, mode, auc in (("new", 1, "eval", 0.72), ("bn0", 0, "train", 0.60), ("bn1", 1, "train", 0.62)):
        run = fake_run(tmp_path / name, seed=seed, test=auc)
        res = json.loads((run / "results.json").read_text())
        res["config"]["trainer"]["eval_bn"] = mode
        (run / "results.json").write_text(json.dumps(res))
    assert "eval_bn" not in (old / "results.json").read_text()
    lines, err = table(capsys, tmp_path)
    assert "| auc_lp (trainer.eval_bn=eval) | 71.0 ± 1.4 (n=2) [paper 72.5] |" in lines
    assert "| auc_lp (trainer.eval_bn=train) | 61.0 ± 1.4 (n=2) [paper 72.5] |" in lines
    assert "placed 4 of 4 usable runs in 2 cells" in err


def _with(run: Path, **keys) -> Path:
    res = json.loads((run / "results.json").read_text())
    res.update(keys)
    (run / "results.json").write_text(json.dumps(res))
    return run


def test_select_reads_the_final_the_best_val_or_the_best_test_evaluation(tmp_path, capsys):
    run = fake_run(tmp_path / "lp", test=0.70, val=0.85)
    (run / "metrics.csv").write_text("step,val_auc,test_auc\n100,0.80,0.78\n150,0.90,0.65\n200,0.85,0.70\n")
    lines, _ = table(capsys, tmp_path)
    assert lines[-1] == "| auc_lp | 70.0 (n=1) [paper 72.5] |" and lines[0].startswith("Test auc in % at the final")
    lines, _ = table(capsys, tmp_path, "--select", "best-val")
    assert lines[-1] == "| auc_lp | 65.0 (n=1) [paper 72.5] |"
    assert lines[0].startswith("Test auc in % at each run's evaluation with the best val_auc")
    lines, _ = table(capsys, tmp_path, "--select", "best-test")
    assert lines[-1] == "| auc_lp | 78.0 (n=1) [paper 72.5] |" and "(selection on test, optimistic)" in lines[0]


def test_code_versions_are_listed_and_a_cell_of_two_commits_gets_a_dagger(tmp_path, capsys):
    _with(fake_run(tmp_path / "a", seed=0, test=0.70), provenance={"git_commit": "a" * 40, "git_dirty": False})
    _with(fake_run(tmp_path / "b", seed=1, test=0.72), provenance={"git_commit": "b" * 40, "git_dirty": True})
    fake_run(tmp_path / "ce", objective="ce", test=0.6)   # from before provenance
    make_tables.main([str(tmp_path)])
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == "code versions: aaaaaaa(1 run), bbbbbbb+dirty(1 run), unrecorded(1 run)."
    assert "| auc_lp | 71.0 ± 1.4 (n=2) † [paper 72.5] |" in lines and "| ce | 60.0 (n=1) [paper 65.2] |" in lines
    assert "†: the cell's runs come from more than one code version." in lines


def test_select_on_a_run_without_validation_says_why_it_is_not_placed(tmp_path, capsys):
    """dataset.split=authors runs have no val_ metrics: best-val has nothing to select on."""
    run = fake_run(tmp_path / "authors", test=0.70)
    (run / "metrics.csv").write_text("step,test_auc\n400,0.66\n800,0.70\n")
    res = json.loads((run / "results.json").read_text())
    del res["final"]["val_auc"]
    res["best_val"] = None
    (run / "results.json").write_text(json.dumps(res))
    with pytest.raises(SystemExit):
        table(capsys, tmp_path, "--select", "best-val", "--lr-rule", "none")
    assert "--select best-val: no evaluation has both test_auc and val_auc" in capsys.readouterr().err
    lines, _ = table(capsys, tmp_path, "--lr-rule", "none")   # the final evaluation still places it
    assert lines[-1] == "| auc_lp | 70.0 (n=1) [paper 72.5] |"
