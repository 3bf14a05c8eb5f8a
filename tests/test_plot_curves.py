"""scripts/tables/plot_curves.py: runs grouped as make_tables pools them, one mean curve per setting."""
from __future__ import annotations

from pathlib import Path

from scripts.tables import plot_curves
from tests.test_make_tables import fake_run  # (one hand-made run folder shape)

ROOT = Path(__file__).resolve().parents[1]


def _with_curve(folder: Path, values: list[float]) -> None:
    rows = ["step,val_auc"] + [f"{100 * (i + 1)},{v}" for i, v in enumerate(values)]
    (folder / "metrics.csv").write_text("\n".join(rows) + "\n")


def test_seeds_share_a_curve_and_settings_do_not(tmp_path):
    _with_curve(fake_run(tmp_path / "lp_s0", seed=0), [0.5, 0.6])
    _with_curve(fake_run(tmp_path / "lp_s1", seed=1), [0.7, 0.8])
    _with_curve(fake_run(tmp_path / "lp_eps", seed=0, epsilon=0.1), [0.55, 0.65])
    _with_curve(fake_run(tmp_path / "ce_s0", objective="ce", seed=0), [0.6, 0.9])
    out = tmp_path / "c.png"
    groups = plot_curves.main([str(tmp_path), "--out", str(out)])
    assert sorted(groups) == ["auc_lp (objective.epsilon=0.01)", "auc_lp (objective.epsilon=0.1)", "ce"]
    assert groups["auc_lp (objective.epsilon=0.01)"] == [[(100, 0.5), (200, 0.6)], [(100, 0.7), (200, 0.8)]]
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_panels_one_per_objective_and_labels_split_at_the_setting():
    assert plot_curves.split_label("auc_lp (optimizer.lr=0.01)") == ("auc_lp", "optimizer.lr=0.01")
    assert plot_curves.split_label("ce") == ("ce", "")


def test_panels_draw_the_same_groups(tmp_path):
    _with_curve(fake_run(tmp_path / "lp_s0", seed=0), [0.5, 0.6])
    _with_curve(fake_run(tmp_path / "lp_eps", seed=0, epsilon=0.1), [0.55, 0.65])
    _with_curve(fake_run(tmp_path / "ce_s0", objective="ce", seed=0), [0.6, 0.9])
    out = tmp_path / "p.png"
    groups = plot_curves.main([str(tmp_path), "--out", str(out), "--panels"])
    assert sorted(groups) == ["auc_lp (objective.epsilon=0.01)", "auc_lp (objective.epsilon=0.1)", "ce"]
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
