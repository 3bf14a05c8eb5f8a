"""Image sources on small fake files in torchvision's own layouts, packs, caches, errors.

CIFAR-100 and STL-10 are not available offline, so their loaders are checked on fakes written
here -- and cross-checked against torchvision's own classes (with their MD5 check patched out,
since fakes cannot match the real checksums).
"""
from __future__ import annotations

import io
import pickle

import numpy as np
import pytest
import torch
import torchvision
from PIL import Image

from lpmetrics.data import DatasetNotFoundError, build_data
from lpmetrics.data import packed
from lpmetrics.data.datasets import ImageDataset
from lpmetrics.data.images import CIFAR100
from lpmetrics.data.torchvision_format import read_cifar10, read_cifar100, read_stl10
from tests.test_data_helpers import dataset_cfg, shared_data_root

RNG = np.random.default_rng(0)


def _balanced(n_per_class: int, k: int) -> np.ndarray:
    return np.tile(np.arange(k), n_per_class)


def _pickle(path, obj):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps(obj))


def write_fake_cifar100(root, n_train_per_class=4, n_test_per_class=2):
    folder = root / "cifar-100-python"
    for name, n in (("train", n_train_per_class), ("test", n_test_per_class)):
        y = _balanced(n, 100)
        x = RNG.integers(0, 256, (len(y), 3072), dtype=np.uint8)
        _pickle(folder / name, {"data": x, "fine_labels": y.tolist(),
                                "coarse_labels": (y // 5).tolist()})
    _pickle(folder / "meta", {"fine_label_names": [f"c{i}" for i in range(100)],
                              "coarse_label_names": [f"s{i}" for i in range(20)]})


def write_fake_cifar10(root, n_per_class_per_batch=2):
    folder = root / "cifar-10-batches-py"
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        y = _balanced(n_per_class_per_batch, 10)
        _pickle(folder / name, {"data": RNG.integers(0, 256, (len(y), 3072), dtype=np.uint8),
                                "labels": y.tolist()})
    _pickle(folder / "batches.meta", {"label_names": [f"c{i}" for i in range(10)]})


def write_fake_stl10(root, n_train_per_class=4, n_test_per_class=2):
    folder = root / "stl10_binary"
    folder.mkdir(parents=True)
    originals = {}
    for split, n in (("train", n_train_per_class), ("test", n_test_per_class)):
        y = _balanced(n, 10)
        x = RNG.integers(0, 256, (len(y), 3, 96, 96), dtype=np.uint8)
        # STL-10 stores each channel plane column-major (Fortran order)
        (folder / f"{split}_X.bin").write_bytes(np.ascontiguousarray(x.transpose(0, 1, 3, 2)).tobytes())
        (folder / f"{split}_y.bin").write_bytes((y + 1).astype(np.uint8).tobytes())  # 1..10
        originals[split] = (x, y)
    (folder / "class_names.txt").write_text("\n".join(f"c{i}" for i in range(10)) + "\n")
    return originals


def write_fake_pack(path, size=16, n_train=40, n_test=20, k=2):
    arrays = {"class_names": np.array(["cat", "dog"][:k]), "fmt": np.array("jpeg")}
    images = {}
    for split, n in (("train", n_train), ("test", n_test)):
        x = RNG.integers(0, 256, (n, size, size, 3), dtype=np.uint8)
        blobs = []
        for img in x:
            buf = io.BytesIO()
            Image.fromarray(img).save(buf, format="JPEG", quality=95)
            blobs.append(buf.getvalue())
        arrays[f"{split}_buf"] = np.frombuffer(b"".join(blobs), dtype=np.uint8)
        arrays[f"{split}_off"] = np.cumsum([0] + [len(b) for b in blobs]).astype(np.int64)
        arrays[f"{split}_y"] = _balanced(n // k, k).astype(np.int64)
        images[split] = np.stack([np.asarray(Image.open(io.BytesIO(b)).convert("RGB")) for b in blobs])
    np.savez(path, **arrays)
    return images


def _pixels(x: torch.Tensor, mean, std) -> np.ndarray:
    """Undo the per-channel normalisation of an item."""
    m, s = torch.tensor(mean).view(-1, 1, 1), torch.tensor(std).view(-1, 1, 1)
    return ((x * s + m) * 255).round().to(torch.uint8).numpy()


def test_cifar100_fake_folder_matches_torchvision(tmp_path, monkeypatch):
    write_fake_cifar100(tmp_path)
    ours = read_cifar100(tmp_path / "cifar-100-python")
    monkeypatch.setattr(torchvision.datasets.cifar, "check_integrity", lambda *a, **k: True)
    for split, train in (("train", True), ("test", False)):
        tv = torchvision.datasets.CIFAR100(str(tmp_path), train=train)
        np.testing.assert_array_equal(ours[f"{split}_x"], tv.data.transpose(0, 3, 1, 2))
        np.testing.assert_array_equal(ours[f"{split}_y"], tv.targets)
    assert ours["class_names"][:2] == ["c0", "c1"]


def test_cifar_reader_accepts_bytes_keys(tmp_path):
    """Pickles re-saved under Python 3 with ``encoding="bytes"`` carry b"data" keys."""
    x = RNG.integers(0, 256, (4, 3072), dtype=np.uint8)
    for name in ("train", "test"):
        _pickle(tmp_path / name, {b"data": x, b"fine_labels": [0, 1, 2, 3]})
    out = read_cifar100(tmp_path)
    np.testing.assert_array_equal(out["train_x"], x.reshape(4, 3, 32, 32))
    assert out["test_y"].tolist() == [0, 1, 2, 3] and out["class_names"] == []


def test_cifar100_binary_and_multiclass_protocol(tmp_path):
    write_fake_cifar100(tmp_path)
    b = build_data(dataset_cfg("cifar100", root=str(tmp_path), val_size=100, neg_keep=0.5), 0)
    assert b.input_shape == (3, 32, 32) and b.origin.endswith("cifar-100-python")
    assert b.stats["train"]["class_counts"] == [50 * 2, 50 * 3]  # 3 per class left, keep 2 of 3
    assert b.stats["val"]["class_counts"] == [50, 50] and b.stats["test"]["n"] == 200
    m = build_data(dataset_cfg("cifar100", root=str(tmp_path), val_size=100, task="multiclass",
                               drop_rate=0.6), 0)
    assert m.stats["train"]["class_counts"] == [33, 33, 34 * 3]  # 0.4 * 3 rounds to 1 per class
    assert m.stats["test"]["class_counts"] == [66, 66, 68]


def test_stl10_fake_binary_files_match_torchvision(tmp_path, monkeypatch):
    originals = write_fake_stl10(tmp_path)
    ours = read_stl10(tmp_path / "stl10_binary")
    monkeypatch.setattr(torchvision.datasets.stl10, "check_integrity", lambda *a, **k: True)
    for split in ("train", "test"):
        np.testing.assert_array_equal(ours[f"{split}_x"], originals[split][0])
        np.testing.assert_array_equal(ours[f"{split}_y"], originals[split][1])
        tv = torchvision.datasets.STL10(str(tmp_path), split=split)
        np.testing.assert_array_equal(ours[f"{split}_x"], tv.data)
        np.testing.assert_array_equal(ours[f"{split}_y"], tv.labels)
    b = build_data(dataset_cfg("stl10", root=str(tmp_path), val_size=10, augment=False), 0)
    assert b.input_shape == (3, 96, 96) and b.stats["train"]["n"] == 30
    x, y = b.test[0]
    np.testing.assert_array_equal(_pixels(x, (0.4467, 0.4398, 0.4066), (0.2603, 0.2566, 0.2713)),
                                  originals["test"][0][0])
    assert int(y) == 0  # test image 0 is class 0 -> negative


def test_cifar10_folder_is_preferred_over_the_pack(tmp_path, monkeypatch):
    write_fake_cifar10(tmp_path)
    (tmp_path / "cifar10.npz").write_bytes(b"not a pack")  # would fail if it were read
    monkeypatch.setattr(torchvision.datasets.cifar, "check_integrity", lambda *a, **k: True)
    tv = torchvision.datasets.CIFAR10(str(tmp_path), train=True)
    ours = read_cifar10(tmp_path / "cifar-10-batches-py")
    np.testing.assert_array_equal(ours["train_x"], tv.data.transpose(0, 3, 1, 2))
    b = build_data(dataset_cfg("cifar10", root=str(tmp_path), val_size=10), 0)
    assert b.origin.endswith("cifar-10-batches-py") and b.stats["train"]["n"] == 90


def test_pack_is_decoded_once_then_read_from_cache(tmp_path, monkeypatch):
    images = write_fake_pack(tmp_path / "catdog50.npz")
    cfg = dataset_cfg("catdog", root=str(tmp_path), val_size=4, augment=False,
                      cache_dir=str(tmp_path / "cache"))
    b = build_data(cfg, 0)
    assert b.input_shape == (3, 16, 16) and len(list((tmp_path / "cache").glob("*.npy"))) == 2
    monkeypatch.setattr(packed, "decode_images", lambda *a: pytest.fail("cache not used"))
    c = build_data(cfg, 0)
    pack = packed.load_pack(tmp_path / "catdog50.npz", tmp_path / "cache")
    np.testing.assert_array_equal(pack["test_x"], images["test"].transpose(0, 3, 1, 2))
    torch.testing.assert_close(b.test[3][0], c.test[3][0])


def test_cache_folder_skips_read_only_roots(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)  # as root, os.access says writable; the permission bits say read-only
    try:
        assert packed.default_cache_dir(ro) == tmp_path / "xdg" / "lpnd"
    finally:
        ro.chmod(0o755)
    assert packed.default_cache_dir(ro) == ro / ".cache"


def test_missing_data_names_the_expected_files(tmp_path):
    with pytest.raises(DatasetNotFoundError) as err:
        build_data(dataset_cfg("cifar10", root=str(tmp_path)), 0)
    msg = str(err.value)
    for want in (str(tmp_path / "cifar-10-batches-py"), "data_batch_1", str(tmp_path / "cifar10.npz"),
                 "DATA_ROOT", "dataset.root=", "dataset.download=true"):
        assert want in msg
    assert isinstance(err.value, FileNotFoundError)
    with pytest.raises(DatasetNotFoundError, match="catdog50.npz") as err:
        build_data(dataset_cfg("catdog", root=str(tmp_path)), 0)
    assert "download=true" not in str(err.value)  # no download exists for Cat&Dog


def test_failed_download_is_a_dataset_not_found_error(tmp_path, monkeypatch):
    def offline(root):
        raise OSError("no network")

    monkeypatch.setattr(CIFAR100, "download", offline)
    with pytest.raises(DatasetNotFoundError, match="download=true failed: OSError: no network"):
        build_data(dataset_cfg("cifar100", root=str(tmp_path), download=True), 0)


def test_augmentation_is_train_only_and_shape_preserving():
    img = RNG.integers(0, 256, (2, 3, 8, 8), dtype=np.uint8)
    flip_only = ImageDataset(img, [0, 1], (0, 0, 0), (1, 1, 1), augment=True, pad=0)
    torch.manual_seed(0)
    seen = {bytes(_pixels(flip_only[0][0], (0, 0, 0), (1, 1, 1))) for _ in range(20)}
    assert seen == {bytes(img[0]), bytes(np.ascontiguousarray(img[0][:, :, ::-1]))}
    crop = ImageDataset(img, [0, 1], (0.5,) * 3, (0.25,) * 3, augment=True)
    outs = torch.stack([crop[1][0] for _ in range(20)])
    assert outs.shape == (20, 3, 8, 8) and outs.std(0).max() > 0
    plain = ImageDataset(img, [0, 1], (0.5,) * 3, (0.25,) * 3)
    torch.testing.assert_close(plain[1][0], (torch.from_numpy(img[1]).float() / 255 - 0.5) / 0.25)


@pytest.mark.data
def test_cifar10_pack_gives_the_papers_91_percent():
    root = shared_data_root()
    if not (root / "cifar10.npz").is_file():
        pytest.skip(f"no CIFAR-10 pack at {root} (set DATA_ROOT)")
    b = build_data(dataset_cfg("cifar10", root=str(root), neg_keep=0.1), seed=0)
    assert b.stats["train"]["class_counts"] == [2250, 22500]
    assert round(b.stats["train"]["pos_fraction"], 3) == 0.909
    assert b.stats["val"]["class_counts"] == [2500, 2500]
    assert b.stats["test"]["class_counts"] == [5000, 5000]
    x, y = b.train[0]
    assert x.shape == (3, 32, 32) and x.dtype == torch.float32 and y.dtype == torch.int64
    v = torch.stack([b.val[i][0] for i in range(0, 5000, 10)])
    assert v.mean().abs() < 0.1 and (v.std() - 1).abs() < 0.1  # normalisation constants fit


@pytest.mark.data
def test_catdog_pack_gives_19k_1k_5k():
    root = shared_data_root()
    if not (root / "catdog50.npz").is_file():
        pytest.skip(f"no Cat&Dog pack at {root} (set DATA_ROOT)")
    b = build_data(dataset_cfg("catdog", root=str(root), neg_keep=0.2), seed=0)
    assert b.input_shape == (3, 50, 50) and b.stats["val"]["n"] == 1000
    dogs = int(packed.load_pack(root / "catdog50.npz")["train_y"].sum())
    assert b.stats["test"]["n"] == 5000
    assert b.stats["train"]["class_counts"][1] + b.stats["val"]["class_counts"][1] == dogs
    assert round(b.stats["train"]["pos_fraction"], 2) == 0.83
