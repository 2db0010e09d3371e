"""The ``optuna-saturn`` command line: run a sweep, re-plan or simulate a recorded one, and report on it.

Why a command line as well as the Python API: a sweep of hours is started from a shell and inspected from
another one, often on a machine without a notebook. Every command works on an Optuna storage URL and a study
name, like ``optuna-dashboard`` and Optuna's own CLI. Mistakes in the input (an objective that cannot be found, a
storage URL that does not parse, more devices than the machine has, an unknown strategy, a study that does not
exist) end with a message that names the fix and exit code 2.
"""

from optuna_saturn.cli import running, inspecting, devices  # noqa: F401, I001  (their commands join the app, in this order)
from optuna_saturn.cli.app import app, main

__all__ = ["app", "main"]
