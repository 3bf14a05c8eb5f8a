"""Typed, actionable errors of the data package."""
from __future__ import annotations


class DatasetNotFoundError(FileNotFoundError):
    """A dataset's files are not where the config points.

    The message names every file or folder that would have been accepted and how to provide one
    (``DATA_ROOT`` / ``dataset.root=``, or ``dataset.download=true`` where a network exists).
    """


class SplitError(ValueError):
    """A split cannot be used for training or evaluation (e.g. the val split holds one class,
    so AUC is undefined). Raised by :func:`data.splits.build_splits` before any training starts."""


class DamagedDatasetError(ValueError):
    """A dataset file exists but is damaged (truncated, altered, not the documented format).

    The message names the file, what is wrong with it (e.g. its SHA-256 against the one the data
    README lists) and how to replace it.
    """
