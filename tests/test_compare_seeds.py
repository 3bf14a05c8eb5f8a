"""``scripts.tables.compare_seeds``: same-seed differences and the reading rule, on run folders
shaped like train.py's (``tests/test_make_tables.fake_run``), numbers worked by hand."""
from __future__ import annotations

from pathlib import Path

import pytest

from scripts.tables import compare_seeds
from scripts.tables.make_tables import Cell, Run
from scripts.tables.queue_cells import row_arm
from tests.test_make_tables import fake_run


def _cell(root: Path, objective: str, tests: list[float], lr: float = 0.01) -> None:
    for seed, t in enumerate(tests):
        fake_run(root / f"{objective}_s{seed}", objective=objective, seed=seed, lr=lr, test=t)


def _pair_lines(capsys, root: Path, *extra: str) -> dict[str, list[str]]:
    compare_seeds.main([str(root), *extra])
    lines = capsys.readouterr().out.splitlines()
    second = lines.index("") + 3   # the pairs' table, after its header and rule
    return {cols[2].strip(): [c.strip() for c in cols[1:-1]]
            for cols in (line.split("|") for line in lines[second:])}


def test_reference_above_when_every_seed_agrees_and_the_mean_clears_both_ranges(tmp_path, capsys):
    _cell(tmp_path, "auc_lp", [0.74, 0.76, 0.75])   # range 2.0
    _cell(tmp_path, "ce", [0.70, 0.71, 0.72])       # range 2.0; differences +4, +5, +3: mean +4.0
    row = _pair_lines(capsys, tmp_path)["auc_lp - ce"]
    assert row == ["cifar10 0.1", "auc_lp - ce", "0, 1, 2", "+4.0, +5.0, +3.0", "+4.0", "2.0, 2.0", "auc_lp above"]


def test_one_way_but_within_the_seed_range_is_not_distinguishable(tmp_path, capsys):
    _cell(tmp_path, "auc_lp", [0.71, 0.76, 0.72])   # range 5.0
    _cell(tmp_path, "ce", [0.70, 0.74, 0.71])       # differences +1, +2, +1: mean 1.33 < 5.0
    assert _pair_lines(capsys, tmp_path)["auc_lp - ce"][-1] == "not distinguishable"


def test_mixed_signs_are_not_distinguishable_and_the_other_row_can_win(tmp_path, capsys):
    _cell(tmp_path, "auc_lp", [0.70, 0.70, 0.70])
    _cell(tmp_path, "ce", [0.75, 0.76, 0.75])        # ce ahead by 5-6, ranges 0 and 1
    _cell(tmp_path, "ppd_sg", [0.72, 0.68, 0.71])    # +/- : no reading
    rows = _pair_lines(capsys, tmp_path)
    assert rows["auc_lp - ce"][3:] == ["-5.0, -6.0, -5.0", "-5.3", "0.0, 1.0", "ce above"]
    assert rows["auc_lp - ppd_sg"][-1] == "not distinguishable"


def test_fewer_than_three_shared_seeds_are_not_read(tmp_path, capsys):
    _cell(tmp_path, "auc_lp", [0.80, 0.80, 0.80])
    _cell(tmp_path, "ce", [0.70])                    # one seed only
    compare_seeds.main([str(tmp_path)])
    out = capsys.readouterr().out
    assert "| auc_lp - ce | 0 | +10.0 | +10.0 | 0.0, 0.0 | too few seeds (1 shared; the rule reads 3) |" in out
    assert "| cifar10 0.1 | ce | 0.01 | 0 | 70.0 | 70.0 | 0.0 | 65.2 | - (1 seed) |" in out
    assert "| cifar10 0.1 | auc_lp | 0.01 | 0, 1, 2 | 80.0, 80.0, 80.0 | 80.0 | 0.0 | 72.5 | no |" in out


def test_the_lr_is_the_tables_per_cell_choice(tmp_path, capsys):
    """Each row at the lr make_tables chooses on validation (here lr 0.1 for ce, by its val)."""
    _cell(tmp_path, "auc_lp", [0.74, 0.76, 0.75])
    for seed, (test, val) in enumerate([(0.60, 0.90), (0.61, 0.90), (0.62, 0.90)]):
        fake_run(tmp_path / f"ce_hi_s{seed}", objective="ce", seed=seed, lr=0.1, test=test, val=val)
    _cell(tmp_path, "ce", [0.70, 0.71, 0.72])        # lr 0.01, val = test < 0.90
    row = _pair_lines(capsys, tmp_path)["auc_lp - ce"]
    assert row[3] == "+14.0, +15.0, +13.0"


def test_arms_are_never_compared_across():
    assert row_arm("ce") is None and row_arm("ce (regime=augmented)") == "augmented"
    assert row_arm("auc_lp (regime=augmented, objective.epsilon=0.1)") == "augmented"

    def cell(label, tests):
        runs = [Run(Path(f"{label}{s}"), label.split()[0], ("cifar10", 0.1), 0.01, s, t, t, {})
                for s, t in enumerate(tests)]
        return Cell(("cifar10", 0.1), label, label.split()[0], 0.01, runs)
    cells = [cell("auc_lp", [70, 71, 72]), cell("ce", [60, 61, 62]),
             cell("auc_lp (regime=augmented)", [80, 81, 82]), cell("ce (regime=augmented)", [90, 91, 92])]
    assert [(p.reference, p.other) for p in compare_seeds.pairs(cells, "auc_lp")] == [("auc_lp", "ce")]
    found = compare_seeds.pairs(cells, "auc_lp (regime=augmented)")
    assert [(p.other, p.diffs, p.reading) for p in found] == [
        ("ce (regime=augmented)", (-10, -10, -10), "ce (regime=augmented) above")]


def test_bad_input_is_one_line_and_status_1(tmp_path, capsys):
    _cell(tmp_path, "auc_lp", [0.74, 0.76, 0.75])
    _cell(tmp_path, "ce", [0.70, 0.71, 0.72])
    with pytest.raises(SystemExit, match=r"compare_seeds: NothingToPlaceError: .*--reference 'f1_lp'.*auc_lp, ce"):
        compare_seeds.main([str(tmp_path), "--reference", "f1_lp"])
    fake_run(tmp_path / "again" / "ce_s1", objective="ce", seed=1, lr=0.01, test=0.5)
    with pytest.raises(SystemExit, match=r"compare_seeds: ValueError: ce @ cifar10 0.1 has seed 1 twice"):
        compare_seeds.main([str(tmp_path)])
    with pytest.raises(SystemExit, match="no such folder"):
        compare_seeds.main([str(tmp_path / "nowhere")])
