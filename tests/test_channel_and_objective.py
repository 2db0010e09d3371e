from __future__ import annotations

import threading

import numpy as np
import objectives
import optuna
import pytest

from optuna_saturn.channel import ChannelClient, ChannelServer, RemoteError
from optuna_saturn.clock import WallClock
from optuna_saturn.study.trial_session import TrialSession
from optuna_saturn.worker.objective_recipe import describe_objective, load_objective


def test_requests_reach_the_real_trial_and_errors_come_back():
    study = optuna.create_study(pruner=optuna.pruners.NopPruner())
    trial = study.ask()
    session = TrialSession(trial, threading.Lock(), WallClock())
    with ChannelServer() as server:
        client = ChannelClient(server.address, server.register(session.handle))
        x = client.call("suggest", method="suggest_float", args=["x", 0.0, 1.0], kwargs={"step": None, "log": False})
        assert trial.params == {"x": x}
        client.call("report", value=0.5, step=3)
        assert client.call("should_prune") is False
        client.call("set_user_attr", key="k", value=[1, 2])
        with pytest.raises(ValueError, match="low"):  # Optuna's own validation, relayed as the same type
            client.call("suggest", method="suggest_float", args=["y", 2.0, 1.0], kwargs={})
        with pytest.raises(ValueError, match="cannot be relayed"):
            client.call("suggest", method="set_system_attr", args=["a", 1], kwargs={})
        client.call("result", values=[1.0])
        client.close()
    assert study.trials[0].intermediate_values == {3: 0.5}
    assert study.trials[0].user_attrs == {"k": [1, 2]}
    assert session.outcome == {"op": "result", "values": [1.0]}


def test_numpy_values_are_sent_as_plain_json():
    session_value = {"flag": np.bool_(True), "x": np.float64(0.25)}
    with ChannelServer() as server:
        client = ChannelClient(server.address, server.register(lambda op, msg: session_value if op != "hello" else 0))
        assert client.call("anything") == {"flag": True, "x": 0.25}


def test_connection_without_a_valid_token_is_refused():
    with ChannelServer() as server:
        server.register(lambda op, msg: None)
        with pytest.raises(ConnectionError):
            ChannelClient(server.address, "not-a-token")


def test_remote_error_survives_pickling_for_broadcast():
    import pickle

    error = pickle.loads(pickle.dumps(RemoteError("GurobiError", "boom")))
    assert str(error) == "GurobiError: boom"


def test_objective_references(tmp_path):
    recipe = describe_objective(objectives.quadratic, str(tmp_path))
    assert recipe["kind"] == "module" and load_objective(recipe) is objectives.quadratic
    offset = 3.0
    closure = lambda trial: offset  # noqa: E731
    recipe = describe_objective(closure, str(tmp_path))
    assert recipe["kind"] == "pickle" and load_objective(recipe)(None) == 3.0
    with pytest.raises(TypeError, match="callable"):
        describe_objective(42, str(tmp_path))  # type: ignore[arg-type]  # not callable on purpose: its error is tested


def test_an_instance_with_call_in_a_script_is_pickled_not_looked_up_by_an_empty_name(tmp_path):
    """An objective that is an instance of a class of the script's (``__main__``) has that module but no name of
    its own: it was recorded as the script's ``""``, and the pool host failed with ``KeyError: ''``."""
    import subprocess
    import sys

    script = tmp_path / "script.py"
    script.write_text(
        "import sys\n"
        "from optuna_saturn.worker.objective_recipe import describe_objective, load_objective\n"
        "class Objective:\n"
        "    def __call__(self, trial):\n"
        "        return 2.0\n"
        "if __name__ == '__main__':\n"
        "    recipe = describe_objective(Objective(), sys.argv[1])\n"
        "    print(recipe['kind'], load_objective(recipe)(None))\n"
    )
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["pickle", "2.0"]
