"""A trial the user's study never sees: asked of a copy of the study in memory.

Under a deadline, the sweep prices one trial before it asks any, to refuse a deadline no plan meets while the
study is still as the user left it. The copy holds the study's trials, user attributes and directions, and a copy
of its sampler, so the stand-in is sampled as the study's next trial would be (the same parameters, for a seeded
sampler), and the study's own sampler state is untouched.
"""

from __future__ import annotations

import copy
import threading

import optuna

_logger = optuna.logging.get_logger("optuna.saturn")


def stand_in_trial(study: optuna.Study, lock: threading.Lock) -> optuna.Trial | None:
    """A new trial of an in-memory copy of ``study`` (read under ``lock``, the study's); None where the sampler
    cannot be copied (it holds a connection, a lock, a process): the sweep then refuses a deadline only once it
    planned its first real trial."""
    with lock:
        try:
            sampler = copy.deepcopy(study.sampler)
        except Exception as exc:  # (any sampler of the user's: what copying it raises is its own)
            _logger.debug(f"The study's sampler cannot be copied ({exc!r}); no trial is priced before the first.")
            return None
        trials = study.get_trials(deepcopy=False)
        user_attrs = study.user_attrs
    storage = optuna.storages.InMemoryStorage()  # (not optuna.create_study: it would log a study the user never made)
    storage.create_new_study(study.directions, study.study_name)
    stand_in = optuna.Study(study.study_name, storage, sampler=sampler, pruner=optuna.pruners.NopPruner())
    stand_in.add_trials(trials)
    for key, value in user_attrs.items():
        stand_in.set_user_attr(key, value)
    return stand_in.ask()
