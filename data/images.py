"""Image sources: CIFAR-10, CIFAR-100, STL-10 (labeled part), Cat&Dog 50x50.

Each is named by ``dataset.source._target_`` and returns the official train / test splits
(:class:`data.source.SourceData`, uint8 ``[N, 3, H, W]``, original labels). Lookup order under
``root``: torchvision's folder, then the ``.npz`` pack, then torchvision's download if
``download=True`` (see :func:`data.source.locate`). Normalisation constants are the usual
per-channel train-set means/stds on the [0, 1] scale (Cat&Dog's computed on its pack's train split).

Sizes (official train / test): CIFAR-10 and CIFAR-100 50,000 / 10,000 (32x32); STL-10
5,000 / 8,000 (96x96); Cat&Dog 20,000 / 5,000 (50x50, the 80/20 split of the paper's 25,000
Kaggle images; pack only -- Kaggle's archive needs a login, so there is no download).
"""
from __future__ import annotations

from lpmetrics.data import torchvision_format as tvf
from lpmetrics.data.source import ImageLayout, SourceData, image_source, locate

CIFAR10 = ImageLayout("CIFAR-10", "cifar10.npz", "cifar-10-batches-py", tvf.CIFAR10_FILES,
                      tvf.read_cifar10, tvf.download_cifar10)
CIFAR100 = ImageLayout("CIFAR-100", "cifar100.npz", "cifar-100-python", tvf.CIFAR100_FILES,
                       tvf.read_cifar100, tvf.download_cifar100)
STL10 = ImageLayout("STL-10", "stl10.npz", "stl10_binary", tvf.STL10_FILES,
                    tvf.read_stl10, tvf.download_stl10)
CATDOG = ImageLayout("Cat&Dog 50x50", "catdog50.npz")  # pack only: no torchvision class


def cifar10(root=None, download: bool = False, cache_dir=None) -> SourceData:
    """CIFAR-10 (Krizhevsky 2009): 10 classes, 32x32."""
    return image_source(locate(root, download, cache_dir, CIFAR10),
                        CIFAR10, (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616), 10)


def cifar100(root=None, download: bool = False, cache_dir=None) -> SourceData:
    """CIFAR-100 (fine labels): 100 classes, 32x32."""
    return image_source(locate(root, download, cache_dir, CIFAR100),
                        CIFAR100, (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762), 100)


def stl10(root=None, download: bool = False, cache_dir=None) -> SourceData:
    """STL-10 labeled part (Coates et al. 2011): 10 classes, 96x96; the unlabeled set is unused."""
    return image_source(locate(root, download, cache_dir, STL10),
                        STL10, (0.4467, 0.4398, 0.4066), (0.2603, 0.2566, 0.2713), 10)


def catdog(root=None, download: bool = False, cache_dir=None) -> SourceData:
    """Kaggle Dogs vs. Cats at 50x50 (cat = 0, dog = 1), from the ``catdog50.npz`` pack."""
    return image_source(locate(root, download, cache_dir, CATDOG),
                        CATDOG, (0.4883, 0.4552, 0.4169), (0.2536, 0.2472, 0.2497), 2)
