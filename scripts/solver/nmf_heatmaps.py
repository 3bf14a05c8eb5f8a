"""NMF heat maps of ResNet-18 activations through the NMF LP layer (Meng et al., ICLR 2021 version, appendix A.3, fig. 2).

For a few CIFAR-10 test images, the activation tensor ``[c, h, w]`` of a ResNet-18 stage is
reshaped to ``V [c, h*w]`` (restricted to the ``--channels`` most active channels: the LP has
``O(c^2)`` variables, the paper used c = 20) and factored by :class:`objectives.nmf.NMFLayer`
with rank k = 1 and 2; each row of ``W`` is a heat map.  Writes ``results/nmf/heatmaps.png`` and
one PNG per image.

    python -m scripts.solver.nmf_heatmaps                       # untrained ResNet-18, 4 images
    python -m scripts.solver.nmf_heatmaps --weights run/last.pt --images 6 --method highs

``--weights`` takes a ``train.py`` checkpoint (``last.pt`` / ``best.pt``: a dict with the ``model``
state dict and the resolved ``config``) of a ``model=resnet18`` run, or a bare ResNet-18 state
dict. The network is rebuilt from the checkpoint's own ``config.model`` (stem included) with the
head size read from ``fc.weight`` (2-way for binary runs, 3-way for the 3-group task), and the
weights are loaded strictly. The file is read with ``torch.load(..., weights_only=True)``
(:func:`runfolder.torch_load`: no code it carries runs); ``--trust-checkpoint`` unpickles in full
one that needs more (an older ``train.py``'s checkpoint). The images are CIFAR-10 test images
normalised with CIFAR-10's constants, whatever data the checkpoint was trained on.
"""
from __future__ import annotations

import argparse
import io
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as Fn

from omegaconf import OmegaConf
from torch import nn

from lpmetrics.run import runfolder
from lpmetrics.run.builders import instantiate_runtime
from lpmetrics.run.targets import upgrade_targets
from lpmetrics.models.resnet import resnet18
from lpmetrics.objectives.nmf import NMFLayer

MEAN, STD = torch.tensor([0.4914, 0.4822, 0.4465]), torch.tensor([0.2470, 0.2435, 0.2616])


def load_images(root: Path, count: int, seed: int) -> np.ndarray:
    from PIL import Image
    pack = root / "cifar10.npz"
    if not pack.exists():
        raise FileNotFoundError(f"no CIFAR-10 pack at {pack}; set DATA_ROOT or --data-root to the "
                                "folder holding cifar10.npz (see ../shared/data/README.md)")
    with np.load(pack) as z:
        buf, off = z["test_buf"], z["test_off"]
        idx = np.random.default_rng(seed).choice(len(off) - 1, count, replace=False)
        return np.stack([np.asarray(Image.open(io.BytesIO(buf[off[i]:off[i + 1]].tobytes())).convert("RGB"))
                         for i in idx])


def load_network(weights: str | None, size: int = 32, trust: bool = False) -> nn.Module:
    """The ResNet-18 to factor: untrained (10-way) when ``weights`` is None, else rebuilt from a
    ``train.py`` checkpoint (its ``config.model`` with the head size of its ``fc.weight``) or from a
    bare state dict, and loaded strictly (a mismatch is an error, not silently skipped weights).
    ``trust``: unpickle in full a file a ``weights_only`` load refuses (else
    :class:`runfolder.UnsafeCheckpointError`)."""
    if not weights:
        return resnet18(num_classes=10, input_shape=[3, size, size]).eval()
    ckpt = runfolder.torch_load(Path(weights), "cpu", trust, opt_in="--trust-checkpoint")
    state = ckpt["model"] if isinstance(ckpt, dict) and "model" in ckpt else ckpt
    if "fc.weight" not in state or "conv1.weight" not in state:
        raise ValueError(f"{weights} holds no ResNet weights (no fc.weight / conv1.weight: keys "
                         f"{sorted(state)[:4]}...); NMF heat maps need a model=resnet18 run's last.pt / best.pt")
    num_classes, channels, kernel = (state["fc.weight"].shape[0], state["conv1.weight"].shape[1],
                                     state["conv1.weight"].shape[-1])
    if channels != 3:
        raise ValueError(f"{weights} was trained on {channels}-channel images; the heat maps use RGB CIFAR-10")
    runtime = {"num_classes": num_classes, "input_shape": [channels, size, size]}
    model_cfg = ckpt.get("config", {}).get("model") if isinstance(ckpt, dict) else None
    if model_cfg:   # a train.py checkpoint: the same _target_ and stem as the run
        net = instantiate_runtime(upgrade_targets(OmegaConf.create(model_cfg)), **runtime)   # old names too
    else:           # a bare state dict: the stem shows in conv1's kernel (3 = CIFAR stem, 7 = ImageNet)
        net = resnet18(**runtime, cifar_stem=kernel == 3)
    net.load_state_dict(state)
    return net.eval()


def activations(images: np.ndarray, net: nn.Module, size: int, stage: str) -> torch.Tensor:
    """Activations ``[N, c, h, w]`` of ``net`` at ``stage`` for uint8 ``[N, H, W, 3]`` images
    resized to ``size`` px and normalised with CIFAR-10's constants."""
    x = torch.as_tensor(images).permute(0, 3, 1, 2).float() / 255
    x = Fn.interpolate((x - MEAN[:, None, None]) / STD[:, None, None], size=size, mode="bilinear")
    with torch.no_grad():
        x = net.maxpool(net.relu(net.bn1(net.conv1(x))))
        for name in ("layer1", "layer2", "layer3", "layer4"):
            x = getattr(net, name)(x)
            if name == stage:
                return x
    raise ValueError(f"unknown stage {stage}")


def factor(act: torch.Tensor, channels: int, ranks: list[int], method: str, penalty: float):
    c, h, w = act.shape
    V = act.reshape(c, h * w).double()
    top = torch.topk(V.sum(1), channels).indices
    V = V[top] + 1e-6  # strictly positive rows so every row normalises
    maps = {}
    for k in ranks:
        t = time.time()
        out = NMFLayer(rank=k, penalty=penalty, method=method)(V)
        maps[k] = (out.W.reshape(k, h, w).numpy(), time.time() - t)
    return maps


def plot(images, all_maps, ranks, path: Path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    cols = 1 + sum(ranks)
    fig, axes = plt.subplots(len(images), cols, figsize=(1.8 * cols, 1.8 * len(images)), squeeze=False)
    for r, (img, maps) in enumerate(zip(images, all_maps)):
        axes[r, 0].imshow(img)
        col = 1
        for k in ranks:
            for j, m in enumerate(maps[k][0]):
                up = Fn.interpolate(torch.as_tensor(m)[None, None], size=img.shape[:2], mode="bilinear")[0, 0]
                axes[r, col].imshow(img)
                axes[r, col].imshow(up.numpy(), cmap="jet", alpha=0.5)
                if r == 0:
                    axes[r, col].set_title(f"k={k} #{j + 1}", fontsize=8)
                col += 1
    for ax in axes.ravel():
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-root", default=os.environ.get("DATA_ROOT", "../shared/data"))
    ap.add_argument("--images", type=int, default=4)
    ap.add_argument("--channels", type=int, default=20, help="channels kept (LP size ~ c^2; paper: 20)")
    ap.add_argument("--size", type=int, default=128, help="input resize (layer3 maps are size/16 wide)")
    ap.add_argument("--stage", default="layer3", help="layer3 at 128 px gives 8x8 maps (w = 64)")
    ap.add_argument("--weights", default=None,
                    help="train.py last.pt / best.pt of a model=resnet18 run (or a bare state dict); default untrained")
    ap.add_argument("--trust-checkpoint", action="store_true",
                    help="unpickle --weights in full when torch.load(weights_only=True) refuses it "
                         "(an older train.py's checkpoint): it can run code, so only for files you trust")
    ap.add_argument("--method", default="lp", choices=["lp", "highs"], help="solver.solve_lp or scipy HiGHS")
    ap.add_argument("--penalty", type=float, default=10.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="results/nmf")
    args = ap.parse_args(argv)
    torch.manual_seed(args.seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    images = load_images(Path(args.data_root), args.images, args.seed)
    acts = activations(images, load_network(args.weights, args.size, args.trust_checkpoint), args.size,
                       args.stage)
    ranks = [1, 2]
    all_maps, timings = [], []
    for i, act in enumerate(acts):
        maps = factor(act, args.channels, ranks, args.method, args.penalty)
        all_maps.append(maps)
        plot(images[i:i + 1], [maps], ranks, out / f"image{i}.png")
        timings.append(f"image {i}: " + ", ".join(f"k={k} {maps[k][1]:.1f}s" for k in ranks))
        print(timings[-1])
    plot(images, all_maps, ranks, out / "heatmaps.png")
    (out / "README.md").write_text(
        "# NMF heat maps (Meng et al., ICLR 2021 version, appendix A.3)\n\n"
        f"Command: `python -m scripts.solver.nmf_heatmaps {' '.join(sys.argv[1:] if argv is None else argv)}`\n\n"
        f"ResNet-18 ({'weights ' + args.weights if args.weights else 'untrained'}), stage {args.stage}, "
        f"input {args.size}px, top {args.channels} channels, method {args.method}, penalty {args.penalty}.\n"
        "Columns: image, k=1 heat map, k=2 heat maps (rows of W, upsampled, jet overlay).\n\n"
        f"LP: {args.channels ** 2 + args.channels} variables, {2 * args.channels * acts.shape[-1] * acts.shape[-2]}"
        " fit rows; solve times (1 CPU thread):\n\n" + "".join(f"- {t}\n" for t in timings))
    print(f"wrote {out}/heatmaps.png")


if __name__ == "__main__":
    main()
