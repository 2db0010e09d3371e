"""The pool host imports what the sweep's strategies import (FSDP's engine, torch._dynamo: seconds) once, before
it forks the workers, unless its warm-up found an objective that prepares nothing for a strategy (a plain
objective, one that only loops over ``trial.steps()``): its trials run as they are, and those seconds would be
start-up that plain Optuna does not pay."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))

#: In a fresh interpreter: the pool host's preparation for the objective named, then which heavy modules it has.
PREPARE = """
import json, sys
from optuna_saturn.worker.warm import prepare_process
recipe = {"kind": "module", "module": "objectives", "qualname": sys.argv[1], "sys_path": [sys.argv[2]]}
prepare_process({"engines": ["single", "ddp", "fsdp"], "multi_device": True, "preload": recipe})
print(json.dumps({name: name in sys.modules for name in ("torch._dynamo", "torch.distributed.fsdp")}))
"""


def _imported_by_the_host(objective: str) -> dict[str, bool]:
    done = subprocess.run(
        [sys.executable, "-c", PREPARE, objective, HERE], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    ("objective", "imported"),
    [
        ("quadratic", False),  # suggests, computes, returns: nothing to choose a strategy for
        ("counted_steps", True),  # prepares a model and loops over trial.steps()
    ],
)
def test_the_host_imports_the_strategies_only_for_an_objective_that_prepares(objective, imported) -> None:
    assert _imported_by_the_host(objective) == {"torch._dynamo": imported, "torch.distributed.fsdp": imported}


def test_an_objective_that_raises_in_the_warm_up_is_taken_for_one_that_prepares() -> None:
    from optuna_saturn.profiler._probe import warm_up

    def raises_first(trial) -> float:
        trial.suggest_float("x", 0, 1)
        raise ValueError("a bug before its model: what it would prepare is not known")

    def plain(trial) -> float:
        return trial.suggest_float("x", 0, 1) ** 2

    assert warm_up(raises_first) is False
    assert warm_up(plain) is True
