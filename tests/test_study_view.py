"""``trial.study`` inside a worker: a read-only view that answers as the study would, and refuses as it would."""

from __future__ import annotations

import pytest

from optuna_saturn.study_view import StudyView


def test_a_nested_optimize_is_refused_as_optuna_refuses_it() -> None:
    view = StudyView({"study_name": "s", "directions": ["MINIMIZE"]})
    with pytest.raises(RuntimeError, match=r"Nested invocation of `Study\.optimize` method isn.t allowed"):
        view.optimize(lambda trial: 0.0, n_trials=1)
    with pytest.raises(AttributeError, match="not available inside a worker"):
        view.add_trial  # noqa: B018  (what the view does not offer is named, with what to do instead)
