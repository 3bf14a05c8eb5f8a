"""``hydra/launcher=packed``: the jobs of a multirun trained in one process as packs."""
