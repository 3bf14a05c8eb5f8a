"""The batched crop/flip and the seeded batch stream (data/augment.py, data/stream.py).

Oracles: the per-image definition of a padded crop + flip written with numpy slicing; the old
stream's shuffling order (``randperm`` seeded ``seed * 100003 + epoch``); CPU vs CUDA when a GPU
exists."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from lpmetrics.data.augment import CropFlip, crop_flip, draw_crop_flip
from lpmetrics.data.datasets import ImageDataset, TabularDataset
from lpmetrics.data.stream import BatchStream, gather
from lpmetrics.run.builders import predict


def reference_crop_flip(img: np.ndarray, dy: int, dx: int, flip: bool, pad: int) -> np.ndarray:
    c, h, w = img.shape
    padded = np.zeros((c, h + 2 * pad, w + 2 * pad), img.dtype)
    padded[:, pad:pad + h, pad:pad + w] = img
    out = padded[:, dy:dy + h, dx:dx + w]
    return out[:, :, ::-1] if flip else out


@pytest.mark.parametrize("seed", range(8))
def test_batched_crop_flip_equals_the_per_image_definition(seed):
    rng = np.random.default_rng(seed)
    pad = int(rng.integers(0, 5))
    h, w = int(rng.integers(3, 9)), int(rng.integers(3, 9))
    imgs = rng.integers(0, 256, (7, 3, h, w), dtype=np.uint8)
    aug = draw_crop_flip(7, pad, torch.Generator().manual_seed(seed))
    out = crop_flip(torch.from_numpy(imgs), aug, pad).numpy()
    for b in range(7):
        ref = reference_crop_flip(imgs[b], int(aug.dy[b]), int(aug.dx[b]), bool(aug.flip[b]), pad)
        np.testing.assert_array_equal(out[b], ref)


def test_draws_cover_every_offset_and_both_flips():
    aug = draw_crop_flip(4000, 4, torch.Generator().manual_seed(0))
    assert set(aug.dy.tolist()) == set(range(9)) == set(aug.dx.tolist())
    assert 0.45 < aug.flip.float().mean() < 0.55


def images(n=37, seed=0):
    rng = np.random.default_rng(seed)
    return ImageDataset(rng.integers(0, 256, (n, 3, 8, 8), dtype=np.uint8), np.arange(n) % 2,
                        (0.5,) * 3, (0.25,) * 3, augment=True, pad=2)


def test_stream_keeps_the_seeded_shuffling_order_and_is_a_function_of_seed_and_step():
    ds, bs = images(), 8
    per_epoch = len(ds) // bs
    stream = BatchStream(ds, bs, seed=3)
    batches = [next(stream) for _ in range(2 * per_epoch + 1)]
    for k, (_, y) in enumerate(batches):
        epoch, j = divmod(k, per_epoch)
        perm = torch.randperm(len(ds), generator=torch.Generator().manual_seed(3 * 100_003 + epoch))
        np.testing.assert_array_equal(y.numpy(), ds.labels[perm[j * bs:(j + 1) * bs].numpy()])
    torch.manual_seed(123)   # the global RNG plays no part
    for start in (1, per_epoch, 2 * per_epoch):
        x, y = next(BatchStream(ds, bs, seed=3, start_step=start))
        assert torch.equal(x, batches[start][0]) and torch.equal(y, batches[start][1])
    other = next(BatchStream(ds, bs, seed=4))
    assert not torch.equal(other[0], batches[0][0])


def test_stream_batch_is_the_normalised_crop_of_the_chosen_images():
    ds = images()
    x, _ = next(BatchStream(ds, 5, seed=0))
    perm = torch.randperm(len(ds), generator=torch.Generator().manual_seed(0))[:5]
    raw = ((x * 0.25 + 0.5) * 255).round().to(torch.uint8).numpy()
    for b, i in enumerate(perm.tolist()):
        # some (dy, dx, flip) must reproduce the image: the batch is a crop/flip of item i
        assert any(np.array_equal(raw[b], reference_crop_flip(ds.images[i].numpy(), dy, dx, f, 2))
                   for dy in range(5) for dx in range(5) for f in (False, True))


def test_small_dataset_smaller_than_a_batch_and_tabular_data():
    ds = TabularDataset(np.arange(12.0).reshape(6, 2), np.arange(6) % 2)
    x, y = next(BatchStream(ds, 8, seed=0))
    assert x.shape == (6, 2) and sorted(y.tolist()) == [0, 0, 0, 1, 1, 1]
    x2, _ = gather(torch.utils.data.TensorDataset(ds.features, ds._y), torch.tensor([2, 0]))
    assert torch.equal(x2, ds.features[[2, 0]])


def test_getitem_and_predict_read_the_same_pixels_as_the_batch_gather():
    ds = images()
    ds.augment = False
    x, y = ds.batch(torch.tensor([4, 9]))
    assert torch.equal(ds[9][0], x[1]) and int(ds[4][1]) == int(y[0])
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 64, 2)).double()
    logits, labels = predict(net.float(), ds, batch_size=10)
    np.testing.assert_allclose(logits, net.float()(torch.stack([ds[i][0] for i in range(len(ds))])).detach().numpy(),
                               rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(labels, ds.labels)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_cpu_and_cuda_streams_give_the_same_batches():
    cpu, gpu = images(), images().to("cuda")
    for (xc, yc), (xg, yg) in zip([next(s) for s in [BatchStream(cpu, 8, 1)] * 3],
                                  [next(s) for s in [BatchStream(gpu, 8, 1)] * 3]):
        assert torch.equal(xc, xg.cpu()) and torch.equal(yc, yg.cpu())


def test_cropflip_slices_like_a_batch():
    aug = CropFlip(torch.arange(4), torch.arange(4) + 1, torch.tensor([True, False, True, False]))
    part = aug[1:3]
    assert part.dy.tolist() == [1, 2] and part.flip.tolist() == [False, True] and aug[0] is aug.dy


def test_resuming_a_run_started_with_the_old_stream_warns(compose_cfg, tmp_path):
    from lpmetrics.data.stream import STREAM_VERSION
    from lpmetrics.run import loop
    from lpmetrics.run.resume import StreamChangeWarning
    cfg = compose_cfg(["dataset=digits", "trainer.max_steps=2", "trainer.eval_every=1"])
    loop.train(cfg, tmp_path)
    ckpt = torch.load(tmp_path / "last.pt", weights_only=False)
    assert ckpt["launches"][0]["batch_stream"] == STREAM_VERSION
    del ckpt["launches"][0]["batch_stream"]   # as a checkpoint made before data/stream.py
    torch.save(ckpt, tmp_path / "last.pt")
    more = compose_cfg(["dataset=digits", "trainer.max_steps=3", "trainer.eval_every=1", "resume=true"])
    with pytest.warns(StreamChangeWarning, match="started with batch stream per-image-global-rng-v1"):
        loop.train(more, tmp_path)
