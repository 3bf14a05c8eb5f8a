"""Damaged packs: a truncated or altered ``.npz`` is named, with how to replace it, instead of a
``zipfile.BadZipFile`` deep in numpy; the SHA-256 the data README lists is checked."""
from __future__ import annotations

import hashlib

import numpy as np
import pytest

from lpmetrics.data import build_data
from lpmetrics.data import packed
from lpmetrics.data.errors import DamagedDatasetError
from tests.test_data_helpers import dataset_cfg, shared_data_root
from tests.test_data_sources import write_fake_pack


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _readme(folder, name, digest):
    (folder / "README.md").write_text(
        "| file | dataset | sha256 |\n|---|---|---|\n"
        f"| `{name}` | fake | `{digest}` |\n")


def test_truncated_pack_names_the_file_and_the_fix(tmp_path):
    pack = tmp_path / "catdog50.npz"
    write_fake_pack(pack)
    pack.write_bytes(pack.read_bytes()[: pack.stat().st_size // 2])    # an interrupted copy
    with pytest.raises(DamagedDatasetError, match=r"pack .*catdog50.npz cannot be read \(BadZipFile") as err:
        build_data(dataset_cfg("catdog", root=str(tmp_path), cache_dir=str(tmp_path / "c")), 0)
    assert f"Replace {pack} with a fresh copy" in str(err.value)


def test_sha256_listed_in_the_readme_is_checked(tmp_path):
    pack = tmp_path / "catdog50.npz"
    write_fake_pack(pack)
    good = _sha(pack)
    _readme(tmp_path, pack.name, f"{good[:8]}…{good[-5:]}")   # the README's abbreviated form
    packed.load_pack(pack, tmp_path / "c")                        # matches: loads
    _readme(tmp_path, pack.name, good)                            # full digest: loads too
    packed.load_pack(pack, tmp_path / "c")
    data = bytearray(pack.read_bytes())
    data[len(data) // 3] ^= 0xFF                                  # one flipped byte, same size
    pack.write_bytes(bytes(data))
    bad = _sha(pack)
    with pytest.raises(DamagedDatasetError) as err:
        packed.load_pack(pack, tmp_path / "c")
    msg = str(err.value)
    assert f"pack {pack} is damaged: its sha256 is {bad[:8]}…{bad[-5:]}" in msg
    assert f"lists {good}" in msg and "sha256sum" in msg and "Replace" in msg


def test_empty_pack_and_missing_arrays(tmp_path):
    pack = tmp_path / "catdog50.npz"
    pack.write_bytes(b"")
    with pytest.raises(DamagedDatasetError, match=r"is empty \(0 bytes\)\. Replace"):
        packed.load_pack(pack, tmp_path / "c")
    np.savez(pack, class_names=np.array(["cat", "dog"]))
    with pytest.raises(DamagedDatasetError, match=r"arrays \['train_buf'.* missing"):
        packed.load_pack(pack, tmp_path / "c")


def test_damaged_cache_entry_is_rebuilt_not_blamed_on_the_pack(tmp_path):
    pack = tmp_path / "catdog50.npz"
    images = write_fake_pack(pack)
    packed.load_pack(pack, tmp_path / "c")
    for npy in (tmp_path / "c").glob("*.npy"):
        npy.write_bytes(npy.read_bytes()[:100])
    out = packed.load_pack(pack, tmp_path / "c")
    np.testing.assert_array_equal(out["test_x"], images["test"].transpose(0, 3, 1, 2))


@pytest.mark.data
@pytest.mark.parametrize("name", ["cifar10.npz", "catdog50.npz"])
def test_shared_packs_match_their_readme(name):
    root = shared_data_root()
    if not (root / name).is_file():
        pytest.skip(f"{root / name} not present")
    listed = packed.listed_sha256(root / name)
    assert listed is not None, "the data README lists a sha256 for every pack"
    packed.check_pack(root / name, _sha(root / name))
