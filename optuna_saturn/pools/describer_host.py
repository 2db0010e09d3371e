"""The describer: the process of the pool that runs the objective to describe a trial (DESIGN decision 18).

A trial is described before it is planned: its objective runs up to its first ``trial.steps()`` loop, with its
model's parameters on the meta device (:func:`~optuna_saturn.profiler.probe_workload`). That is the user's code,
and it may do anything: call ``sys.exit()``, ``os._exit()``, hang, start threads, fork, start DataLoader workers.
So it never runs in the executor's process. The describer is a process of its own, started with the pool (a fork
of the executor where that is safe, so its imports cost nothing), and each description runs in a fork of the
describer, in a session of its own:

- its ``suggest_*`` are relayed to the real trial over the sweep's channel (as a worker's are), so the trial's
  hyperparameters are decided once, by the user's sampler, in the executor;
- whatever it leaves behind ends with it: its threads with its process, its children (forks, DataLoader workers,
  orphans the describer reaps as their subreaper) killed once it has answered;
- it has a time limit: past it, it is killed, and the executor is told so;
- how it ended (its answer, or its exit code or signal when it gave none) goes back to the executor, which fails the
  trial with the reason where the objective exited, was killed or hung.

The describer itself never runs user code, never touches a GPU, and runs one thread, so its forks are safe. What a
description imported of a library (a model class imported lazily) the describer imports after it, for the next
forks (:mod:`~optuna_saturn.pools.learned_imports`).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import tempfile
import threading
import time
import traceback
from typing import Any

from optuna_saturn.pools import learned_imports

#: Who the describer's processes are, in ``ps``.
DESCRIBER_NAME = "saturn-describer"
#: The exit code of a description whose own code failed (not the objective's: it answers what the objective did):
#: its traceback is in the describer's log, and the trial is planned from estimates.
DESCRIPTION_FAILED = 86


def main(config_path: str) -> None:
    """The describer process: serve describe orders until the executor says to exit (or dies)."""
    from optuna_saturn.channel import ChannelClient
    from optuna_saturn.pools.process_identity import started_as
    from optuna_saturn.worker.objective_recipe import load_objective

    # (what a description's children leave behind comes back to it, as their reaper, to be ended)
    config = started_as(DESCRIBER_NAME, config_path)
    os.environ["OPTUNA_SATURN_WORKER"] = "1"  # (an objective that starts a sweep of its own is refused, as in a worker)
    import torch

    torch.set_num_threads(1)  # a description reads shapes; its forks must not inherit a thread pool
    import accelerate  # noqa: F401  (what every description uses, imported once here, not in each fork)

    # (a process's first optimizer imports torch._dynamo: 1.3 s a description, paid here once)
    import torch._dynamo

    import optuna_saturn.profiler._probe
    import optuna_saturn.worker.described_trial  # noqa: F401

    objective = load_objective(config["objective"])
    channel = ChannelClient(config["channel"], config["token"], hello={"describer": True})
    while True:
        order = channel.call("next")
        if order.get("exit"):
            break
        handle, imports = tempfile.mkstemp(prefix="saturn-describe-", suffix=".json")
        os.close(handle)
        ended = describe_in_a_fork(order, objective, imports)
        channel.call("done", id=order["id"], **ended)
        # (after answering: the executor plans and starts the trial meanwhile; the next fork starts with them)
        learned_imports.import_what_was_written(imports)
    channel.close()


def describe_in_a_fork(order: dict, objective: Any, imports: str) -> dict[str, Any]:
    """Describe ``order``'s trial in a fork of this process, within ``order["limit"]`` seconds; how the fork ended:
    ``exit_code`` (a negative one is the signal that killed it), or ``timed_out``. The fork writes to the file
    ``imports`` the library modules it imported (:mod:`~optuna_saturn.pools.learned_imports`)."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            before = frozenset(sys.modules)
            os.setsid()  # its own session: whatever it forks is ended with it
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            _describe(order, objective)
            learned_imports.write(imports, learned_imports.library_modules_imported_since(before))
        except BaseException:
            traceback.print_exc()
            code = DESCRIPTION_FAILED
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)  # (its threads, non-daemon ones too, end here: nothing of it may linger)
    status = _wait(pid, float(order["limit"]))
    _end_what_it_left(pid)
    if status is None:
        return {"timed_out": True}
    return {"exit_code": os.waitstatus_to_exitcode(status)}


def _wait(pid: int, limit: float) -> int | None:
    """The fork's wait status, or None once ``limit`` seconds passed (it was killed, and reaped)."""
    deadline = time.monotonic() + limit
    try:
        handle = os.pidfd_open(pid)
    except (AttributeError, OSError):  # (Linux before 5.3: look every few milliseconds)
        handle = None
    try:
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return status
            left = deadline - time.monotonic()
            if left <= 0:
                _kill_group(pid)
                os.waitpid(pid, 0)
                return None
            if handle is not None:
                select.select([handle], [], [], left)
            else:
                time.sleep(min(left, 0.005))
    finally:
        if handle is not None:
            os.close(handle)


def _end_what_it_left(pid: int) -> None:
    """Kill what the description left: its session's processes, and every other descendant of this process (its
    orphans, reparented here: this process is their subreaper), then reap them."""
    import psutil

    _kill_group(pid)
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            child.kill()
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                break
        except ChildProcessError:
            break


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def _describe(order: dict, objective: Any) -> None:
    """In the fork: describe the trial, and answer the executor over the trial's own channel connection."""
    from optuna_saturn import raised
    from optuna_saturn.channel import ChannelClient
    from optuna_saturn.profiler import NothingToDescribe, probe_workload
    from optuna_saturn.worker.described_trial import DescribedTrial

    me = os.getpid()
    channel = ChannelClient(order["channel"], order["token"])
    trial = DescribedTrial(channel, order["trial"], number=int(order["number"]))
    answer: dict[str, Any]
    try:
        answer = {"workload": probe_workload(objective, trial, threading.Lock(), throwaway=True).to_json()}
    except NothingToDescribe as exc:  # it prepares no model: nothing of it, nor of later trials, to describe
        answer = {"error": str(exc), "nothing_to_describe": True}
    except RuntimeError as exc:  # it cannot be described this way: planned from runtime estimates
        answer = {"error": str(exc)}
    except BaseException as exc:  # (SystemExit, KeyboardInterrupt: the objective's own, past probe_workload)
        answer = {"raised": raised.record(exc)}
    if os.getpid() != me:  # a fork the objective made returned from it too: it says nothing, and ends here
        os._exit(0)
    channel.call("described", **answer)
    channel.close()


if __name__ == "__main__":
    main(sys.argv[1])
