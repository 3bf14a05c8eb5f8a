"""Every entry point ends a user's error with one typed line and a non-zero exit, as ``train.py``.

``eval.py``: a run folder that does not exist, one with no checkpoint, ``--checkpoint`` naming no
file, a checkpoint that is not one (8 bytes of text), a truncated one, both of a run's checkpoints
damaged, data this machine lacks, and the fall back from a damaged ``last.pt`` to ``last.prev.pt`` (a note, with eval's
consequence: the metrics are of that step). A damaged file is named as damaged with what to
evaluate instead, never with torch's advice to load it with ``weights_only=False``.
``python -m scripts.tables.make_tables``: a folder that does not exist, nothing to place, an
unreadable or missing ``queue.json``.

The cases call the command line's function in the process (fast: ``eval.cli``,
``make_tables.main``) and read the ``SystemExit`` it raises, which Python prints alone on stderr
with exit status 1; one case per entry point runs the real command line in a subprocess and
checks exactly that.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

import eval as ev
from scripts.tables import make_tables
from tests.test_eval import _make_run

ROOT = Path(__file__).resolve().parents[1]
#: what torch says of a file it cannot unpickle safely; never relayed for a damaged checkpoint
UNSAFE_ADVICE = ("weights_only", "trusted source", "arbitrary code")


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A tiny finished run (digits, MLP): ``last.pt`` at step 80, ``best.pt`` at step 0."""
    run, _ = _make_run(tmp_path_factory.mktemp("made"), "binary", steps=20)
    return run


@pytest.fixture
def run(made, tmp_path):
    """A fresh copy of the run that a case may damage."""
    return Path(shutil.copytree(made, tmp_path / "run"))


def one_line(call) -> str:
    """The message of the ``SystemExit`` that ``call()`` raises: one line, status 1 (a string)."""
    with pytest.raises(SystemExit) as stop:
        call()
    message = stop.value.code
    assert isinstance(message, str), "SystemExit(str) is printed alone and exits with status 1"
    assert "\n" not in message and "Traceback" not in message
    return message


def cli(*args: str) -> subprocess.CompletedProcess:
    env = os.environ | {"OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)


def evaluate(*args) -> str:
    return one_line(lambda: ev.cli([*map(str, args), "--device", "cpu"]))


# ---- eval.py -----------------------------------------------------------------------------------

def test_eval_a_run_folder_that_does_not_exist(tmp_path):
    msg = evaluate(tmp_path / "nowhere")
    assert msg.startswith("eval.py: CheckpointError: run folder ") and "does not exist" in msg


def test_eval_a_folder_with_no_checkpoint(tmp_path):
    msg = evaluate(tmp_path)
    assert msg.startswith(f"eval.py: CheckpointError: no last.pt in {tmp_path} (checkpoints there: none)")
    assert msg.endswith("pass --checkpoint PATH")


def test_eval_checkpoint_bogus(run):
    msg = evaluate(run, "--checkpoint", "bogus")
    assert msg.startswith(f"eval.py: CheckpointError: checkpoint bogus not found (nor in {run})")


def test_eval_eight_bytes_of_text_is_not_a_checkpoint_and_no_unsafe_advice(run):
    (run / "last.pt").write_text("not a ck")
    msg = evaluate(run)
    assert msg.startswith(f"eval.py: CheckpointError: checkpoint {run / 'last.pt'} is damaged (not a "
                          "checkpoint: its 8 bytes are neither torch's zip archive nor a pickle); ")
    assert msg.endswith(f"evaluate another checkpoint of the run instead: --checkpoint {run / 'best.pt'}")
    assert not any(a in msg for a in UNSAFE_ADVICE), msg


@pytest.mark.parametrize("keep", [0.02, 0.5, 0.98])   # torch's reader fails in two ways across these
def test_eval_a_truncated_checkpoint_names_it_so(run, keep):
    data = (run / "best.pt").read_bytes()
    (run / "cut.pt").write_bytes(data[:int(len(data) * keep)])
    msg = evaluate(run, "--checkpoint", "cut.pt")
    assert msg.startswith(f"eval.py: CheckpointError: checkpoint {run / 'cut.pt'} is damaged (a checkpoint "
                          f"archive cut short ({int(len(data) * keep)} bytes, no zip directory at its end): "
                          "written or copied only in part); evaluate another checkpoint of the run instead: "
                          f"--checkpoint {run / 'best.pt'}")
    assert not any(a in msg for a in UNSAFE_ADVICE), msg


def test_eval_a_damaged_last_pt_named_explicitly_points_to_the_previous(run):
    shutil.copy(run / "best.pt", run / "last.prev.pt")
    (run / "last.pt").write_bytes((run / "last.pt").read_bytes()[:4096])
    msg = evaluate(run, "--checkpoint", "last.pt")
    assert msg.endswith(f"; evaluate the previous one instead: --checkpoint {run / 'last.prev.pt'}")


def test_eval_falls_back_to_last_prev_with_eval_s_own_consequence(run, tmp_path, capsys):
    shutil.copy(run / "best.pt", run / "last.prev.pt")      # step 0
    (run / "last.pt").write_text("not a ck")
    record = ev.cli([str(run), "--device", "cpu", "--out", str(tmp_path / "ev")])
    assert record["step"] == 0 and record["checkpoint"] == str(run / "last.prev.pt")
    note = capsys.readouterr().err.strip()
    assert note.startswith(f"eval.py: checkpoint {run / 'last.pt'} is damaged (not a checkpoint: its 8 bytes")
    assert note.endswith(f"using the previous checkpoint {run / 'last.prev.pt'} (step 0) instead: the "
                         "metrics are of that step, not of the run's last evaluation")
    assert "trained again" not in note and not any(a in note for a in UNSAFE_ADVICE)


def test_eval_both_checkpoints_damaged_names_both(run):
    (run / "last.pt").write_text("not a ck")
    (run / "last.prev.pt").write_bytes(b"")
    (run / "best.pt").unlink()
    msg = evaluate(run)
    assert msg.startswith(f"eval.py: CheckpointError: no usable checkpoint in {run}: checkpoint "
                          f"{run / 'last.pt'} is damaged (not a checkpoint")
    assert f"checkpoint {run / 'last.prev.pt'} is damaged (empty (0 bytes))" in msg
    assert msg.endswith("no other checkpoint is there: train the run again (its config: "
                        f"{run / '.hydra' / 'config.yaml'})")


def test_eval_data_this_machine_lacks(run):
    ckpt = torch.load(run / "last.pt", weights_only=True)
    cifar = OmegaConf.load(ROOT / "configs" / "dataset" / "cifar10.yaml")
    cifar.pop("defaults")
    cifar.root = str(run / "no_data")
    ckpt["config"]["dataset"] = OmegaConf.to_container(cifar)
    torch.save(ckpt, run / "last.pt")
    msg = evaluate(run)
    assert msg.startswith("eval.py: DatasetNotFoundError: ") and str(run / "no_data") in msg


def test_eval_command_line_prints_one_line_and_exits_1(run):
    (run / "last.pt").write_text("not a ck")
    done = cli("eval.py", str(run), "--device", "cpu")
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("eval.py: CheckpointError: "), done.stderr
    assert done.stdout == ""


# ---- make_tables -------------------------------------------------------------------------------

def tables(*args) -> str:
    return one_line(lambda: make_tables.main([*map(str, args)]))


def test_make_tables_a_folder_that_does_not_exist(tmp_path):
    msg = tables(tmp_path / "nowhere", tmp_path)
    assert msg == f"make_tables: FileNotFoundError: no such folder: {tmp_path / 'nowhere'}"


def test_make_tables_nothing_to_place(tmp_path):
    msg = tables(tmp_path, "--table", "f1")
    assert msg.startswith("make_tables: NothingToPlaceError: nothing to place in --table f1")


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", None], ids=["garbled", "a list", "missing"])
def test_make_tables_a_queue_it_cannot_read(tmp_path, content):
    queue = tmp_path / "queue.json"
    if content is not None:
        queue.write_text(content)
    msg = tables(tmp_path, "--queue", queue)
    assert msg.startswith(f"make_tables: QueueFileError: ") and str(queue) in msg


def test_make_tables_command_line_prints_one_line_and_exits_1(tmp_path):
    (tmp_path / "queue.json").write_text("{not json")
    done = cli("-m", "scripts.tables.make_tables", str(tmp_path))
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("make_tables: QueueFileError: "), done.stderr
    assert done.stdout == ""


# ---- python -m scripts.campaign


@pytest.mark.parametrize("args, kind, words", [
    (["--dir", "{missing}", "status"], "QueueFileError", "cannot read the queue"),
    (["--dir", "{missing}", "cpu", "status"], "QueueFileError", "cannot read the queue"),
    (["fold", "{missing}"], "FoldError", "no runs.jsonl.gz"),
    (["fold-cpu", "{tmp}"], "FoldError", "no results.json, the run is not finished"),
    (["plan", "--speed", "{missing}/speed.json"], "FileNotFoundError", "speed.json"),
])
def test_campaign_user_errors_are_one_typed_line(tmp_path, capsys, args, kind, words):
    from scripts.campaign import cli as campaign
    args = [a.format(missing=tmp_path / "nope", tmp=tmp_path) for a in args]
    assert campaign.main(args) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"campaign: {kind}: ") and words in err, err


def test_campaign_command_line_prints_one_line_and_exits_1(tmp_path):
    done = subprocess.run([sys.executable, "-m", "scripts.campaign", "--dir", str(tmp_path), "status"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.strip().startswith("campaign: QueueFileError: ") and len(done.stderr.strip().splitlines()) == 1
