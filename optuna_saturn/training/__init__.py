"""What a trial's training loop uses inside its worker: the trial's own helpers (``trial.prepare``,
``trial.steps``, ``trial.checkpoint``), sharding, micro-batches, a loader's position, the random state, and the
values relayed to the executor. Users reach them through :class:`~optuna_saturn.SaturnTrial`."""
