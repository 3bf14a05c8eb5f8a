"""Hydra's submitit launchers made resumable, a pack per submitit job, and an install hint for the
cluster and tuning plugins (docs/scaling.md)."""
