"""One soak on one storage (``benchmarks/soak.py``; ``tests/test_soak.py`` runs a short one): sweeps of the same
study in processes of their own, and the faults, each fired once a seeded share (10-60%) of the trials ended.

The faults (``FAULTS``):

- ``worker``: ``kill -9`` of a warm worker of the sweep while it runs two trials of one device each;
- ``rank``: ``kill -9`` of one rank of a two-device trial: of the second sweep's, whose trials all run on both
  devices (``ddp``), else of the main sweep's (fired at the first such trial once armed);
- ``executor``: ``kill -9`` of the sweep's executor; a new executor process is then started on the same study,
  asking the trials still owed, as a user reruns their script;
- ``lock``: a stale DeepSpeed build lock (no holder, 20 minutes old) left where the workers load their ops, just
  before a sweep starts (the executor's rerun if there is one, else the first sweep);
- ``outage``: the storage unreachable for ``outage`` seconds; ``disk``: the disk under ``log_dir`` full for
  ``disk`` seconds (both go on while the other faults fire);
- ``second``: a second sweep on the same study, asking a few of the trials, at the same time (it leases its
  devices in a folder of its own, as a sweep on another machine would).

A sweep that exits without its trials (an abort) is counted, and started again the same way.
"""

from __future__ import annotations

import collections
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import soak_faults
from soak_checks import Verdict, check_leftovers, check_trials
from soak_sweep import SECONDS_ENV, STEPS, STRATEGIES_ENV, STUDY, open_storage

from optuna_saturn.study.records import record

HERE = Path(__file__).resolve().parent
_STARTED = re.compile(r"trial (\d+) started: \S+ on ([^;]+);")
FAULTS = ("worker", "rank", "executor", "lock", "outage", "disk", "second")


@dataclass
class Result:
    storage: str
    verdict: Verdict
    injected: collections.Counter = field(default_factory=collections.Counter)
    missed: list[str] = field(default_factory=list)
    aborted: int = 0
    sweeps: int = 0
    wall: float = 0.0
    work: str = ""


class Soak:
    def __init__(self, storage, *, trials: int, seed: int, work: Path, faults: set[str], seconds: tuple[float, float],
                 outage: float, disk: float, hang: float) -> None:  # fmt: skip
        self.storage, self.trials, self.work, self.faults = storage, trials, work, faults
        self.outage_seconds, self.disk_seconds, self.hang = outage, disk, hang
        self.rng = random.Random(f"{seed}-{storage.kind}")
        self.seed, self.seconds = seed, seconds
        share = {f: self.rng.uniform(0.1, 0.6) for f in FAULTS}  # (all drawn: the seed alone decides each one)
        self.pending = {f: share[f] * trials for f in faults if f != "lock"}
        if "rank" in self.pending and "second" in self.pending:  # (a rank of the second sweep's trials)
            self.pending["rank"] = self.pending["second"]
        self.second_trials = max(4, trials // 50) if "second" in faults else 0
        self.mark = uuid.uuid4().hex
        self.log_dir = work / "runs"
        self.temp = work / "tmp"
        self.temp.mkdir()
        self.leases = [work / "leases", work / "leases-second"]
        self.extensions = soak_faults.extensions_copy(work)
        self.lock: Path | None = None
        self.reader = open_storage(storage.spec)
        self.launches = 0
        self.lasting: list[threading.Thread] = []
        self.main: subprocess.Popen | None = None
        self.logs: dict[int, Path] = {}
        self.second: subprocess.Popen | None = None
        self.second_pids: set[int] = set()
        self.result = Result(storage.kind, Verdict(), work=str(work))
        self.disk = soak_faults.FullDisk(self.log_dir) if "disk" in faults else None  # (last: run() unmounts it)

    # -- sweeps -------------------------------------------------------------------------------------------------------
    def _start(self, n_trials: int, *, second: bool = False) -> subprocess.Popen:
        self.launches += 1
        self.result.sweeps += 1
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(HERE.parent), str(HERE), os.environ.get("PYTHONPATH", "")]),
            "SOAK_RUN": self.mark,
            SECONDS_ENV: f"{self.seconds[0]},{self.seconds[1]}",
            "TMPDIR": str(self.temp),
            "OPTUNA_SATURN_LEASES": str(self.leases[1 if second else 0]),
            "TORCH_EXTENSIONS_DIR": str(self.extensions),
        }
        name = f"sweep-{self.launches:02d}{'-second' if second else ''}"
        command = [sys.executable, str(HERE / "soak_sweep.py"), self.storage.spec, str(self.log_dir), str(n_trials)]
        command += [str(self.seed * 1000 + self.launches), str(self.work / f"{name}.leaks.json")]
        if second:
            env[STRATEGIES_ENV] = "ddp"  # (every trial of it on both devices: ranks to kill)
        with open(self.work / f"{name}.log", "wb") as log:
            sweep = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.logs[sweep.pid] = self.work / f"{name}.log"
        if second:
            self.second_pids.add(sweep.pid)
        return sweep

    def _trials(self) -> list | None:
        import optuna

        try:
            storage = optuna.load_study(study_name=STUDY, storage=self.reader)._storage
            return storage.get_all_trials(storage.get_study_id_from_name(STUDY), deepcopy=False)
        except Exception:  # (an outage, or a file locked for a moment: the next look)
            return None

    def _owed(self, trials: list) -> int:
        """New trials no sweep has asked yet and none alive will."""
        asked = sum(record(t, "retry_of") is None for t in trials)
        second_owes = self.second_trials if self.second is None else 0  # (not started yet: it will ask them)
        if self.second is not None and self.second.poll() != 0:  # (running, or to be started again)
            second_owes = self.second_trials - self._second_asked(trials)
        return self.trials - asked - max(0, second_owes)

    def _second_asked(self, trials: list) -> int:
        return sum(
            record(t, "retry_of") is None and (record(t, "owner") or {}).get("pid") in self.second_pids for t in trials
        )

    def _second_again(self, trials: list) -> None:
        """A second sweep that exited on an error (its script met the outage as it loaded the study, say) is
        started again for what it still owes, as its user would."""
        if self.second is None or self.second.poll() in (None, 0):
            return
        self.result.aborted += 1
        time.sleep(2.0)
        self.second = self._start(max(0, self.second_trials - self._second_asked(trials)), second=True)

    # -- faults -------------------------------------------------------------------------------------------------------
    def _running(self, sweep: subprocess.Popen | None, trials: list, *, early: bool = False) -> list[int]:
        """The device counts of the trials ``sweep`` runs now (``early``: those in the first half of their steps,
        where a kill lands mid-trial, not after the ranks returned); its log says where each started (a trial's
        devices are recorded in the study only at its end)."""
        if sweep is None or sweep.poll() is not None:
            return []
        limit = STEPS // 2 if early else STEPS + 1
        running = {t.number for t in trials if t.state.name == "RUNNING" and len(t.intermediate_values) < limit}
        log = self.logs[sweep.pid]
        started = {int(n): where.count(",") + 1 for n, where in _STARTED.findall(log.read_text(errors="replace"))}
        return [count for number, count in started.items() if number in running]

    def _fire(self, fault: str, trials: list) -> bool:
        """Fire ``fault`` if it can be now; whether it was."""
        devices = self._running(self.main, trials)
        if fault == "worker":  # (both devices busy, one trial at least in its first half)
            ready = devices.count(1) >= 2 and 1 in self._running(self.main, trials, early=True)
            targets = soak_faults.workers(self.main.pid) if ready else []
            return bool(targets) and soak_faults.kill_9(self.rng.choice(targets))
        if fault == "rank":  # (the second sweep's trials run on 2 devices each; else one of the main sweep's)
            sweep = self.second if self.second is not None and self.second.poll() is None else self.main
            targets = soak_faults.workers(sweep.pid) if 2 in self._running(sweep, trials, early=True) else []
            return bool(targets) and soak_faults.kill_9(self.rng.choice(targets))
        if fault == "executor":
            if not devices:
                return False
            self._kill_and_rerun()
            return True
        if fault in ("outage", "disk"):  # (while it lasts, the other faults go on)
            during = self.storage.outage if fault == "outage" else self.disk.fill
            seconds = self.outage_seconds if fault == "outage" else self.disk_seconds
            self.lasting.append(threading.Thread(target=during, args=(seconds,), name=f"soak-{fault}"))
            self.lasting[-1].start()
        elif fault == "second":
            self.second = self._start(self.second_trials, second=True)
        return True

    def _fire_due(self, trials: list, done: int, among: tuple[str, ...] = FAULTS) -> None:
        """Fire the first fault due (its share of trials ended) that can fire now."""
        for fault, at in sorted(self.pending.items(), key=lambda item: item[1]):
            if fault in among and done >= at and self._fire(fault, trials):
                del self.pending[fault]
                self.result.injected[fault] += 1
                print(f"  {self.storage.kind}: {fault} at {done} trials ended", flush=True)
                return

    def _plant_lock(self) -> None:
        if "lock" in self.faults and self.lock is None:
            self.lock = soak_faults.plant_stale_lock(self.extensions)
            self.result.injected["lock"] += 1

    def _kill_and_rerun(self) -> None:
        tree = psutil.Process(self.main.pid).children(recursive=True)
        soak_faults.kill_9(psutil.Process(self.main.pid))
        self.main.wait()
        psutil.wait_procs(tree, timeout=30)
        time.sleep(self.rng.uniform(0.0, 2.0))
        self._plant_lock()
        trials = None
        while trials is None:  # (an outage: wait it out)
            time.sleep(0.5)
            trials = self._trials()
        self.main = self._start(max(0, self._owed(trials)))

    # -- the soak -----------------------------------------------------------------------------------------------------
    def run(self) -> Result:
        began = time.monotonic()
        if "executor" not in self.faults:
            self._plant_lock()
        self.main = self._start(self.trials - self.second_trials)
        last_done, last_change = -1, time.monotonic()
        try:
            while True:
                trials = self._trials()
                if trials is None:
                    time.sleep(0.5)
                    continue
                done = sum(t.state.is_finished() for t in trials)
                if done != last_done:
                    last_done, last_change = done, time.monotonic()
                self._second_again(trials)
                if self.main.poll() is not None:
                    self.result.aborted += self.main.returncode != 0
                    if "second" in self.pending:  # (the main sweep ended first: the second one still comes)
                        self._fire("second", trials)
                        del self.pending["second"]
                        self.result.injected["second"] += 1
                    owed = self._owed(trials)
                    if owed <= 0 and self.main.returncode == 0:
                        break
                    if self.main.returncode != 0:
                        time.sleep(2.0)  # (an abort: what a user does, a moment later)
                    self.main = self._start(max(0, owed))
                    continue
                self._fire_due(trials, done)
                if time.monotonic() - last_change > self.hang:
                    print(f"  {self.storage.kind}: no trial ended in {self.hang:.0f} s: stopping", flush=True)
                    break
                time.sleep(0.5)
            deadline = time.monotonic() + self.hang
            while self.second is not None and self.second.poll() != 0 and time.monotonic() < deadline:
                trials = self._trials()  # (past the deadline, a second sweep still running is counted stuck)
                if trials is not None:
                    self._second_again(trials)
                    if "rank" in self.pending:  # (the main sweep is done: the second one's trials still run)
                        self._fire_due(trials, last_done, among=("rank",))
                time.sleep(0.5)
        finally:
            self.result.wall = time.monotonic() - began
            self._finish()
        return self.result

    def _finish(self) -> None:
        for lasting in self.lasting:
            lasting.join()
        verdict = self.result.verdict
        self.result.missed = sorted(self.pending)
        for sweep in (self.main, self.second):
            if sweep is not None and sweep.poll() is None:
                verdict.problem("stuck", f"sweep {sweep.pid} still running at the end: stopped")
                _stop(sweep)
        deadline = time.monotonic() + 30
        while soak_faults.marked(self.mark) and time.monotonic() < deadline:
            time.sleep(0.5)
        left = soak_faults.marked(self.mark)
        check_leftovers(
            verdict,
            processes=left,
            leak_files=sorted(self.work.glob("*.leaks.json")),
            lease_folders=[f for f in self.leases if f.exists()],
            temp_folder=self.temp,
            log_dir=self.log_dir,
        )
        if self.lock is not None and self.lock.exists():
            verdict.problem("stuck", f"the stale build lock {self.lock} was left: a ZeRO job would wait on it")
        for p in left:
            soak_faults.kill_9(p)
        trials = None
        for _ in range(120):
            trials = self._trials()
            if trials is not None:
                break
            time.sleep(1)
        check_trials(trials or [], verdict)
        if self.disk is not None:
            self.disk.unmount(self.work / "runs-kept")
        self.storage.close()


def _stop(sweep: subprocess.Popen) -> None:
    for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 30)):
        if sweep.poll() is not None:
            return
        try:
            os.killpg(sweep.pid, sig)
        except ProcessLookupError:
            return
        try:
            sweep.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue


def run_soak(storage, *, trials: int, seed: int, work: Path, faults: set[str], seconds: tuple[float, float],
             outage: float = 30.0, disk: float = 20.0, hang: float = 600.0) -> Result:  # fmt: skip
    """Create the study on ``storage`` (a ``soak_faults`` storage) and soak it (see the module's docstring)."""
    import optuna

    unknown = set(faults) - set(FAULTS)
    if unknown:
        raise ValueError(f"unknown faults {sorted(unknown)}: choose among {', '.join(FAULTS)}")
    optuna.create_study(study_name=STUDY, storage=open_storage(storage.spec))
    return Soak(storage, trials=trials, seed=seed, work=work, faults=set(faults), seconds=seconds, outage=outage,
                disk=disk, hang=hang).run()  # fmt: skip
