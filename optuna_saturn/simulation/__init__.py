"""The simulated world: the real sweep loop on a pool whose jobs end at virtual times (:mod:`.pool`), priced by
runtimes that are given (:mod:`.prices`), on a virtual clock; and a recorded sweep read back as such a world
(:mod:`.replay`). :func:`~optuna_saturn.simulation.simulator.simulate` runs one; ``optuna-saturn simulate``
replays a study's recorded trials."""
