"""The run layer: what builds, validates, prepares, resumes and checkpoints one training run.

``train.py`` (the loop and ``@hydra.main``) and :mod:`lpmetrics.packed` (many runs as one packed
model) both import it; it imports only the layers below it (objectives, baselines, data, models,
metrics, solver), never a script.

* :mod:`~lpmetrics.run.validate` -- the config checks a run makes before it starts;
* :mod:`~lpmetrics.run.builders` -- model, objective, scheduler and prediction from a config;
* :mod:`~lpmetrics.run.runfolder` -- checkpoints, ``metrics.csv``, ``results.json``, resume checks;
* :mod:`~lpmetrics.run.atomic` -- crash-safe file writes;
* :mod:`~lpmetrics.run.guards` -- finite-loss and degenerate-batch guards;
* :mod:`~lpmetrics.run.provenance` -- the commit, versions and device a run records;
* :mod:`~lpmetrics.run.loggers` -- the csv and wandb loggers;
* :mod:`~lpmetrics.run.targets` -- ``_target_`` names before and after the package existed.
"""
