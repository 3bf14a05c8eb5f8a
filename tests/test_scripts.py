"""scripts/make_tables.py groups run folders into the paper's table layout."""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _fake_run(folder: Path, objective: str, neg_keep: float, auc: float) -> None:
    folder.mkdir(parents=True)
    results = {"final": {"test_auc": auc}, "choices": {"objective": objective},
               "config": {"objective": {"_target_": "x.Y"}, "dataset": {"name": "cifar10", "neg_keep": neg_keep}}}
    (folder / "results.json").write_text(json.dumps(results))


def test_make_tables_binary(tmp_path):
    _fake_run(tmp_path / "0", "ce", 0.1, 0.60)
    _fake_run(tmp_path / "1", "ce", 0.1, 0.70)
    _fake_run(tmp_path / "2", "auc_lp", 0.1, 0.72)
    out = subprocess.run([sys.executable, "scripts/make_tables.py", str(tmp_path), "--table", "binary"],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert "| ce | 65.0 ± 7.1 (paper 65.2) |" in out
    assert "| auc_lp | 72.0 (paper 72.5) |" in out
