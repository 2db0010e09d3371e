"""A run again's link to the run it repeats (``saturn:retry_of``), followed only where it is this study's own.

``saturn:retry_of`` is a user attribute (DESIGN's public contract), so it travels wherever a trial's ``user_attrs``
are copied: ``new.enqueue_trial(t.params, user_attrs=t.user_attrs)`` re-runs another study's trials with a link
that names a trial this study lacks, or one that is not an earlier failed run of the same params. Such a link is
foreign: the trial runs as a new one, from the start, with a warning, and never stops the sweep (a lookup that
raised ``KeyError`` at intake stopped it, failing the trials beside it)."""

from __future__ import annotations

from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from optuna_saturn.study.gateway import StudyGateway
from optuna_saturn.study.records import record

_logger = optuna.logging.get_logger("optuna.saturn")


def inherit_earlier_run(gateway: StudyGateway, trial: optuna.Trial) -> bool:
    """Whether ``trial`` runs again a failed trial of this study; if it does, it starts with the intermediate
    values the earlier run reported (the pruner sees its curve). A foreign link is warned of and ignored."""
    retry_of = record(trial, "retry_of")
    if retry_of is None:
        return False
    with gateway.lock:
        earlier, why_not = _own_earlier_run(gateway, trial, retry_of)
        if earlier is None:
            _logger.warning(
                f"Trial {trial.number}'s saturn:retry_of names {retry_of!r}, which {why_not} (its user attributes "
                "were copied from another study or trial?). It runs as a new trial, from the start."
            )
            return False
        for step, value in sorted(earlier.intermediate_values.items()):
            trial.report(value, step)
    return True


def retries_of(trial: Any, *, is_retry: bool) -> int:
    """How many runs the trial's params had before this one: 0 unless it is a run again of this study's
    (:func:`inherit_earlier_run`), since a copied ``saturn:retries`` counts another study's runs."""
    retries = record(trial, "retries", 0) if is_retry else 0
    return retries if isinstance(retries, int) and not isinstance(retries, bool) and retries >= 0 else 0


def _own_earlier_run(gateway: StudyGateway, trial: optuna.Trial, retry_of: Any) -> tuple[FrozenTrial | None, str]:
    """(the earlier run ``retry_of`` names, "") or (None, why it is no earlier run of this trial's)."""
    if not isinstance(retry_of, int) or isinstance(retry_of, bool):
        return None, "is not a trial number"
    storage = gateway.study._storage
    try:
        trial_id = storage.get_trial_id_from_study_id_trial_number(gateway.study._study_id, retry_of)
    except KeyError:
        return None, "is no trial of this study"
    earlier = storage.get_trial(trial_id)
    if earlier.number >= trial.number:
        return None, "is no earlier trial of this study"
    if earlier.state != TrialState.FAIL:
        return None, f"ended {earlier.state.name}, not FAIL"
    frozen: Any = getattr(trial, "_cached_frozen_trial", trial)  # (as the trial last read itself)
    fixed = frozen.system_attrs.get("fixed_params")
    if fixed is not None and fixed != earlier.params:
        return None, "ran other params"
    return earlier, ""
