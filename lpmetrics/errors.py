"""The error every layer raises for a config value it cannot use.

It lives at the bottom of the package (it imports nothing), so a component below the run layer
(a baseline's constructor) and the run layer's checks (:mod:`lpmetrics.run.validate`) raise the
same type, and ``train.py`` reports either as one message without a traceback.
"""
from __future__ import annotations


class ConfigError(ValueError):
    """A config value this run cannot use; the message names the key, the value and a fix."""
