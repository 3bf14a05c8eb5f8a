"""Checkpoints load without running code: ``train.py`` and the packed launcher write only what
``torch.load(..., weights_only=True)`` reads, every load goes through :func:`runfolder.torch_load`,
and a checkpoint that needs more is refused with :class:`runfolder.UnsafeCheckpointError` by
``eval.py``, ``resume=true``, ``trainer.init_from`` and ``scripts/solver/nmf_heatmaps.py``, unless the
caller opts in (``trainer.trust_checkpoint=true``, ``--trust-checkpoint``).

The hostile file carries an object whose ``__reduce__`` writes a marker file when unpickled (a
control test shows a full unpickling does write it); the old-format file is the checkpoint an
older ``train.py`` wrote (numpy's RNG key as an ndarray: a numpy global).
"""
from __future__ import annotations

import importlib.util
import io
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

import eval as ev
import train
from lpmetrics.data import build_data
from lpmetrics.errors import ConfigError
from lpmetrics.packed.launch import Job, train_packed
from lpmetrics.run import loop
from lpmetrics.run import runfolder
from lpmetrics.run.builders import build_model
from lpmetrics.run.prepare import init_weights
from lpmetrics.run.rng import rng_state, set_rng_state
from lpmetrics.run.validate import validate
from tests.test_faults import COMPARED, _same

ROOT = Path(__file__).resolve().parents[1]
SHORT = ["dataset=digits", "model=mlp", "trainer.max_steps=20", "trainer.eval_every=10",
         "trainer.batch_size=32", "device=cpu", "logger=csv"]

spec = importlib.util.spec_from_file_location("nmf_heatmaps", ROOT / "scripts" / "solver" / "nmf_heatmaps.py")
nmf_heatmaps = importlib.util.module_from_spec(spec)
spec.loader.exec_module(nmf_heatmaps)


class WritesMarker:
    """Unpickling it runs ``exec``: it writes ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return exec, (f"open({str(self.path)!r}, 'w').write('code ran')",)


def old_format(ckpt: dict) -> dict:
    """``ckpt`` as an older ``train.py`` wrote it: numpy's RNG state as ``np.random.get_state()``
    returns it (the same state), no ``trainer.trust_checkpoint`` in the config."""
    kind, key, *rest = ckpt["rng"]["numpy"]
    rng = {**ckpt["rng"], "numpy": (kind, key.numpy().astype(np.uint32), *rest)}
    config = {**ckpt["config"], "trainer": {k: v for k, v in ckpt["config"]["trainer"].items()
                                            if k != "trust_checkpoint"}}
    return {**ckpt, "rng": rng, "config": config}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """``full``: 20 steps; ``half``: the same run stopped at step 10 (its last.pt plain)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    root = tmp_path_factory.mktemp("runs")

    def cfg(*extra):
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
            return compose(config_name="config", overrides=[*SHORT, *extra])
    loop.train(cfg(), root / "full")
    loop.train(cfg("trainer.max_steps=10"), root / "half")
    return root


def copy_run(src: Path, dst: Path) -> Path:
    dst.mkdir(parents=True)
    for p in src.rglob("*"):
        if p.is_file():
            (dst / p.relative_to(src)).parent.mkdir(parents=True, exist_ok=True)
            (dst / p.relative_to(src)).write_bytes(p.read_bytes())
    return dst


def hostile(run: Path, marker: Path) -> Path:
    """``run``'s last.pt with a code-running object added (everything else intact)."""
    ckpt = torch.load(run / "last.pt", weights_only=True)
    torch.save({**ckpt, "extra": WritesMarker(marker)}, run / "last.pt")
    return run / "last.pt"


# ---- what the writers write ----------------------------------------------------------------------

def test_train_py_checkpoints_load_weights_only(runs):
    for name in ("last.pt", "best.pt", "last.prev.pt"):
        path = runs / "full" / name
        if path.is_file():
            ckpt = torch.load(path, weights_only=True)
            assert runfolder.unplain_entry(ckpt) is None, name
    ckpt = torch.load(runs / "full" / "last.pt", weights_only=True)
    assert set(runfolder.TRAIN_STATE) <= set(ckpt) and isinstance(ckpt["config"], dict)


def test_packed_launcher_checkpoints_load_weights_only(compose_cfg, tmp_path):
    short = ["dataset=digits", "trainer.max_steps=2", "trainer.eval_every=1"]
    jobs = [Job(compose_cfg([*short, f"seed={s}"]), tmp_path / f"s{s}", name=f"s{s}") for s in (0, 1)]
    assert all(r["diverged"] is None for r in train_packed(jobs))
    for s in (0, 1):
        for name in ("last.pt", "best.pt"):
            ckpt = torch.load(tmp_path / f"s{s}" / name, weights_only=True)
            assert runfolder.unplain_entry(ckpt) is None
        ckpt = torch.load(tmp_path / f"s{s}" / "last.pt", weights_only=True)
        assert set(runfolder.TRAIN_STATE) <= set(ckpt)


def test_rng_state_survives_a_weights_only_round_trip():
    torch.manual_seed(3), np.random.seed(3), random.seed(3)
    np.random.standard_normal()   # a cached Gaussian in numpy's state
    buf = io.BytesIO()
    torch.save(rng_state(), buf)
    expected = (torch.rand(3), np.random.standard_normal(3), random.random())
    buf.seek(0)
    set_rng_state(torch.load(buf, weights_only=True))
    again = (torch.rand(3), np.random.standard_normal(3), random.random())
    assert torch.equal(expected[0], again[0]) and np.array_equal(expected[1], again[1])
    assert expected[2] == again[2]
    old, new = np.random.get_state(), rng_state()   # the same state, old and new format
    draws = []
    for state in ({**new, "numpy": old}, new):
        set_rng_state(state)
        draws.append(np.random.standard_normal(4))
    assert np.array_equal(*draws)


@pytest.mark.parametrize("bad,where", [
    (lambda: {"rng": {"numpy": np.random.get_state()}}, "['rng']['numpy'][1] is a numpy.ndarray"),
    (lambda: {"config": OmegaConf.create({"a": 1})}, "['config'] is a omegaconf.dictconfig.DictConfig"),
    (lambda: {"rows": [{"auc": np.float64(0.5)}]}, "['rows'][0]['auc'] is a numpy.float64"),
])
def test_saving_a_state_a_weights_only_load_would_refuse_is_an_error(tmp_path, bad, where):
    with pytest.raises(TypeError, match=f"{tmp_path / 'last.pt'} would need more .*"
                                        + where.replace("[", r"\[").replace("]", r"\]")):
        runfolder.save_checkpoint(bad(), tmp_path)
    with pytest.raises(TypeError, match="best.pt"):
        runfolder.save_best(bad(), tmp_path)
    assert not list(tmp_path.iterdir())


def test_trust_checkpoint_must_be_a_boolean(compose_cfg):
    with pytest.raises(ConfigError, match="trainer.trust_checkpoint='yes' must be true"):
        validate(compose_cfg(["trainer.trust_checkpoint=yes"]))


# ---- a checkpoint that would run code is refused everywhere --------------------------------------

def test_the_hostile_checkpoint_runs_code_when_fully_unpickled(runs, tmp_path):
    """Control: the payload is real, so 'no marker' below means the loads refused it."""
    path = hostile(copy_run(runs / "half", tmp_path / "run"), tmp_path / "marker")
    torch.load(path, weights_only=False)
    assert (tmp_path / "marker").read_text() == "code ran"


def test_eval_resume_init_from_and_nmf_refuse_a_hostile_checkpoint(runs, compose_cfg, tmp_path):
    marker = tmp_path / "marker"
    run = copy_run(runs / "half", tmp_path / "run")
    (run / "last.prev.pt").write_bytes((run / "last.pt").read_bytes())   # a safe one: no fall back
    path = hostile(run, marker)
    refused = pytest.raises(runfolder.UnsafeCheckpointError,
                            match=f"{path} needs more than .*GLOBAL .*exec.*trust")
    with refused as err:
        ev.evaluate_run(run, device="cpu", out_dir=tmp_path / "ev")
    assert "eval.py --trust-checkpoint" in str(err.value)
    with refused:
        ev.main([str(path), "--device", "cpu", "--out", str(tmp_path / "ev")])
    with refused:
        ev.evaluate_run(run, checkpoint="last.pt", device="cpu", out_dir=tmp_path / "ev")
    with refused as err:
        loop.train(compose_cfg([*SHORT, "resume=true"]), run)
    assert "trainer.trust_checkpoint=true" in str(err.value)
    with refused:
        loop.train(compose_cfg([*SHORT, f"trainer.init_from={path}"]), tmp_path / "fresh")
    with refused as err:
        nmf_heatmaps.load_network(str(path))
    assert "--trust-checkpoint" in str(err.value)
    assert not marker.exists()
    assert issubclass(runfolder.UnsafeCheckpointError, train.USER_ERRORS)   # Hydra prints the message


# ---- an old-format checkpoint loads with the opt-in ----------------------------------------------

def test_old_format_run_resumes_only_with_the_opt_in_and_ends_as_uninterrupted(runs, compose_cfg, tmp_path):
    run = copy_run(runs / "half", tmp_path / "run")
    torch.save(old_format(torch.load(run / "last.pt", weights_only=True)), run / "last.pt")
    with pytest.raises(runfolder.UnsafeCheckpointError,
                       match=r"last.pt needs more .*numpy.*trainer.trust_checkpoint=true"):
        loop.train(compose_cfg([*SHORT, "resume=true"]), run)
    with pytest.warns(UserWarning, match="unpickled in full"):
        loop.train(compose_cfg([*SHORT, "resume=true", "trainer.trust_checkpoint=true"]), run)
    assert (run / "metrics.csv").read_bytes() == (runs / "full" / "metrics.csv").read_bytes()
    a, b = (torch.load(d / "last.pt", weights_only=True) for d in (run, runs / "full"))   # plain again
    for key in COMPARED:
        if key != "timings":
            assert _same(a[key], b[key]), key


def test_old_format_checkpoint_evaluates_and_initialises_only_with_the_opt_in(runs, compose_cfg, tmp_path):
    run = copy_run(runs / "full", tmp_path / "run")
    ckpt = torch.load(run / "last.pt", weights_only=True)
    torch.save(old_format(ckpt), run / "last.pt")
    with pytest.raises(runfolder.UnsafeCheckpointError, match="eval.py --trust-checkpoint"):
        ev.main([str(run), "--device", "cpu", "--out", str(tmp_path / "ev")])
    with pytest.warns(UserWarning, match="unpickled in full"):
        record = ev.main([str(run), "--device", "cpu", "--out", str(tmp_path / "ev"), "--trust-checkpoint"])
    assert record["step"] == 20
    assert record["metrics"]["auc"] == pytest.approx(ckpt["rows"][-1]["test_auc"], abs=1e-9)
    with pytest.raises(runfolder.UnsafeCheckpointError, match="trainer.trust_checkpoint=true"):
        loop.train(compose_cfg([*SHORT, f"trainer.init_from={run / 'last.pt'}"]), tmp_path / "a")
    model = build_model(compose_cfg(SHORT), build_data(compose_cfg(SHORT).dataset, seed=0))
    with pytest.warns(UserWarning, match="unpickled in full"):
        init_weights(model, run / "last.pt", torch.device("cpu"), trust=True)
    for k, v in model.state_dict().items():
        assert torch.equal(v, ckpt["model"][k]), k
