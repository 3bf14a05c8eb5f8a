"""scripts/tables/summarize_runs.py: one row per run folder, from the last row of its metrics.csv."""
from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("summarize_runs", ROOT / "scripts" / "tables" / "summarize_runs.py")
summarize = importlib.util.module_from_spec(spec)
spec.loader.exec_module(summarize)


def test_rows_from_last_evaluation(tmp_path):
    for name, rows, done in [("a", ["500,0.6,0.7", "1000,0.8,0.9"], True), ("b", ["500,0.55,0.5"], False)]:
        run = tmp_path / "sweep" / name
        run.mkdir(parents=True)
        (run / "metrics.csv").write_text("step,val_auc,test_f1\n" + "\n".join(rows) + "\n")
        if done:
            (run / "results.json").write_text("{}")
    runs = summarize.run_folders([tmp_path / "sweep"])
    assert [r.name for r in runs] == ["a", "b"]
    table = summarize.render(runs, tmp_path)
    lines = table.splitlines()
    assert lines[2].startswith("| sweep/a | 1000 | yes | 0.800 |") and "| 0.900 |" in lines[2]
    assert lines[3].startswith("| sweep/b | 500 | stopped | 0.550 |")


def test_eval_records_and_best_val_become_columns(tmp_path):
    run = tmp_path / "r"
    run.mkdir()
    (run / "metrics.csv").write_text("step,val_auc,test_auc\n500,0.7,0.71\n1000,0.6,0.62\n")
    (run / "results.json").write_text('{"best_val": {"step": 500, "test_auc": 0.71}}')
    (run / "eval_test_bntrain.json").write_text('{"metrics": {"auc": 0.65, "acc": 0.5}}')
    table = summarize.render([run], tmp_path, "auc", best=True).splitlines()
    assert table[0].endswith("| test_bntrain_auc | best_val_step | best_val_test_auc |")
    assert table[2].endswith("| 0.620 |  |  | 0.650 | 500 | 0.710 |")


def test_step_selects_a_common_evaluation(tmp_path):
    for name, rows in [("a", ["500,0.6", "1000,0.8"]), ("b", ["500,0.55"])]:
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.csv").write_text("step,val_auc\n" + "\n".join(rows) + "\n")
    lines = summarize.render([tmp_path / "a", tmp_path / "b"], tmp_path, step=500).splitlines()
    assert lines[2].startswith("| a | 500 | stopped | 0.600 |") and lines[3].startswith("| b | 500 | stopped | 0.550 |")
    assert summarize.render([tmp_path / "b"], tmp_path, step=1000).splitlines()[2].startswith("| b |  | stopped |  |")


def test_columns_pick_metrics_and_best_val_reports_its_own_val(tmp_path):
    run = tmp_path / "r"
    run.mkdir()
    (run / "metrics.csv").write_text("step,val_auc,test_auc,test_bntrain_auc\n500,0.7,0.71,0.69\n1000,0.6,0.62,0.58\n")
    (run / "results.json").write_text('{"best_val": {"step": 500, "val_auc": 0.7, "test_auc": 0.71}}')
    table = summarize.render([run], tmp_path, "auc", best=True,
                             columns=["test_auc", "test_bntrain_auc"]).splitlines()
    assert table[0] == ("| run | steps | finished | test_auc | test_bntrain_auc | best_val_step | best_val_val_auc"
                        " | best_val_test_auc |")
    assert table[2] == "| r | 1000 | yes | 0.620 | 0.580 | 500 | 0.700 | 0.710 |"
