"""The run layer: what builds, validates, prepares, trains, resumes, evaluates and checkpoints one run.

``train.py`` (the ``@hydra.main`` entry) runs :func:`~lpmetrics.run.loop.train`, and
:mod:`lpmetrics.packed` (many runs as one packed model) prepares, evaluates and records its runs
through the same modules; both import this layer, and it imports only the layers below it
(baselines, objectives, data, models, metrics, solver, ``lpmetrics.errors`` and
``lpmetrics.atomic``), never a script (``.importlinter``).

* :mod:`~lpmetrics.run.loop` -- the training loop of one run (:func:`~lpmetrics.run.loop.train`);
* :mod:`~lpmetrics.run.prepare` -- a run's folder, data, model and objective from its seed;
* :mod:`~lpmetrics.run.job` -- :class:`~lpmetrics.run.job.Run`: a run's components and record
  (evaluate, checkpoint, ``results.json``);
* :mod:`~lpmetrics.run.evaluation` -- one evaluation's metrics, test in both BatchNorm modes;
* :mod:`~lpmetrics.run.resume` -- continuing from a run folder's checkpoint;
* :mod:`~lpmetrics.run.request` -- a checkpoint between evaluations, asked for by ``SIGUSR1``;
* :mod:`~lpmetrics.run.rng` -- seeding the global RNGs, and their state in a checkpoint;
* :mod:`~lpmetrics.run.timer` -- per-phase step times;
* :mod:`~lpmetrics.run.validate` -- the config checks a run makes before it starts;
* :mod:`~lpmetrics.run.builders` -- device, model, objective and prediction from a config;
* :mod:`~lpmetrics.run.schedule` -- the learning-rate schedules;
* :mod:`~lpmetrics.run.runfolder` -- checkpoints, ``metrics.csv``, ``results.json``, resume checks;
* :mod:`~lpmetrics.run.guards` -- finite-loss and degenerate-batch guards;
* :mod:`~lpmetrics.run.provenance` -- the commit, versions and device a run records;
* :mod:`~lpmetrics.run.loggers` -- the csv and wandb loggers;
* :mod:`~lpmetrics.run.targets` -- ``_target_`` names before and after the package existed;
* :mod:`~lpmetrics.run.upgrade` -- an older run's saved config brought to today's keys.
"""
if not __name__.startswith("lpmetrics."):   # one identity per class (lpmetrics/__init__.py)
    raise ImportError(f"import lpmetrics.{__name__}, not the bare folder name {__name__!r}")
