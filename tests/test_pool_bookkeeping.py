"""The warm pool's bookkeeping when a worker dies, replayed against the real pool without a pool host: the worker's
messages are handed to the pool as its channel would hand them, in each order they can come in, and the workers are
real processes (``sleep``) killed at the point of the story where a trial's rank would die.

The sweep hung for ever when a killed worker's connection closed before its process was seen to be gone, or when
its replacement said hello first: the rank it ran never ended, and a stop then killed the idle replacement."""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

import pytest

from optuna_saturn.channel import ChannelServer
from optuna_saturn.devices import Device
from optuna_saturn.pools.warm import JobEnd, WorkerPool


def _process() -> subprocess.Popen:
    return subprocess.Popen(["sleep", "60"])


def _kill(process: subprocess.Popen) -> None:
    process.kill()
    process.wait()


@pytest.fixture
def pool(tmp_path: Path):
    with ChannelServer() as server:
        devices = [Device("cpu", i, cores=(i,)) for i in range(2)]
        pool = WorkerPool(devices, log_dir=tmp_path, grace_period=0.5)
        pool._server = server  # (what start() does before it starts a host: the bookkeeping runs without one)
        yield pool


def _say(pool: WorkerPool, op: str, **message):
    return pool._handle(op, message)


def _start_job(pool: WorkerPool, tmp_path: Path, key: str, workers: dict[int, subprocess.Popen]) -> None:
    for device, process in workers.items():
        _say(pool, "hello", worker=device, pid=process.pid)
    pool.submit(key, {"objective": {}}, sorted(workers), log=tmp_path / f"{key}.log")
    for device in workers:
        order = _say(pool, "next", worker=device)
        assert order["job"]["name"] == key


def _ends(pool: WorkerPool, seconds: float = 5.0) -> list[JobEnd]:
    deadline = time.monotonic() + seconds
    ends: list[JobEnd] = []
    while not ends and time.monotonic() < deadline:
        ends = pool.wait(0.1)
    return ends


@pytest.mark.parametrize("order", ["close-before-death-is-seen", "replacement-says-hello-first"])
def test_a_killed_workers_rank_ends_whichever_message_comes_first(pool, tmp_path, order):
    first, replacement = _process(), _process()
    try:
        _start_job(pool, tmp_path, "trial-0", {0: first})
        if order == "close-before-death-is-seen":  # its process still shows as alive when the close comes
            _say(pool, "closed", worker=0, pid=first.pid)
            _kill(first)
            _say(pool, "hello", worker=0, pid=replacement.pid)
        else:
            _say(pool, "hello", worker=0, pid=replacement.pid)
            _kill(first)
            _say(pool, "closed", worker=0, pid=first.pid)
        ends = _ends(pool)
        assert [(e.key, e.clean) for e in ends] == [("trial-0", False)]
        assert "the worker of device 0 died" in ends[0].reason
        assert pool.ready() == {0}  # the replacement is up and idle: the next job can run there
    finally:
        _kill(first)
        _kill(replacement)


def test_a_worker_killed_before_its_first_step_whose_close_is_never_heard_ends_its_rank(pool, tmp_path):
    worker = _process()
    try:
        _start_job(pool, tmp_path, "trial-0", {0: worker})
        _kill(worker)  # nothing is said: the channel thread that would hear the close is elsewhere
        ends = _ends(pool)
        assert [(e.key, e.clean) for e in ends] == [("trial-0", False)]
        assert "died" in ends[0].reason
    finally:
        _kill(worker)


def test_a_stop_ends_at_once_a_rank_whose_worker_was_replaced_and_spares_the_replacement(pool, tmp_path):
    first, replacement = _process(), _process()
    try:
        _start_job(pool, tmp_path, "trial-0", {0: first})
        _kill(first)
        _say(pool, "hello", worker=0, pid=replacement.pid)
        pool.stop("trial-0", reason="its ranks reported no progress")
        ends = _ends(pool, seconds=2.0)
        assert [(e.key, e.clean) for e in ends] == [("trial-0", False)]
        assert replacement.poll() is None  # the idle replacement was not the stop's business
    finally:
        _kill(first)
        _kill(replacement)


def test_a_rank_that_dies_stops_its_peers(pool, tmp_path):
    a, b = _process(), _process()
    try:
        _start_job(pool, tmp_path, "trial-0", {0: a, 1: b})
        _kill(a)
        _say(pool, "closed", worker=0, pid=a.pid)  # rank 0 died: rank 1 waits in a collective with it
        ends = _ends(pool)
        assert [(e.key, e.clean) for e in ends] == [("trial-0", False)]
        assert b.wait(timeout=5) is not None  # its peer was stopped after the grace period
    finally:
        _kill(a)
        _kill(b)


def test_the_grace_timer_of_a_run_that_ended_spares_a_new_run_under_the_same_key(pool, tmp_path):
    a, b, c, d = (_process() for _ in range(4))
    try:
        _start_job(pool, tmp_path, "trial-0", {0: a, 1: b})
        _kill(a)
        _say(pool, "closed", worker=0, pid=a.pid)  # rank 0 died; its peer's grace timer starts
        _say(pool, "done", worker=1, clean=False, recycle=True)  # the peer fails alike, within the grace period
        assert [(e.key, e.clean) for e in _ends(pool)] == [("trial-0", False)]
        # the trial is planned again under the same key on the fresh workers, before the first run's timer fires
        _start_job(pool, tmp_path, "trial-0", {0: c, 1: d})
        deadline = time.monotonic() + 30  # the first run's timer has fired (and spared the new run) once it is gone
        while any(t.name == "saturn-grace" for t in threading.enumerate()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(t.name == "saturn-grace" for t in threading.enumerate())
        assert c.poll() is None and d.poll() is None
    finally:
        for process in (a, b, c, d):
            _kill(process)


def test_a_cut_or_empty_rank_error_file_is_passed_over_and_an_error_is_written_whole(tmp_path):
    """A rank's error file cut by a full disk or a kill used to raise out of the pool's wait and stop the sweep
    (reliability review, finding 13): it is read past, and a rank writes its file under another name first."""
    from optuna_saturn.worker.failures import error_file, first_failure, record_failure

    prefix = str(tmp_path / "job-7")
    record_failure(prefix, 1, "RuntimeError: boom", "crash")
    with open(error_file(prefix, 0), "w", encoding="utf-8") as f:
        f.write('{"rank": 0, "time": 1.0, "err')  # cut
    open(error_file(prefix, 2), "w").close()  # empty
    failure = first_failure(prefix)
    assert failure is not None and failure.rank == 1 and failure.kind == "crash"
    assert not list(tmp_path.glob("*.partial"))


def test_a_rank_that_lost_its_peer_is_passed_over_for_the_one_that_failed(tmp_path):
    """Rank 0 saw its peer go (first in time: rank 1's error was written as it died); rank 1's error is the
    job's failure. With only peer-gone errors, the first of them is."""
    from optuna_saturn.worker.failures import PEER_GONE, first_failure, record_failure

    prefix = str(tmp_path / "job-9")
    record_failure(prefix, 0, "RuntimeError: Connection reset by peer", PEER_GONE)
    assert first_failure(prefix).kind == PEER_GONE
    record_failure(prefix, 1, "ValueError: loss is nan", "crash")
    failure = first_failure(prefix)
    assert failure is not None and failure.rank == 1 and failure.kind == "crash"


def test_a_rank_error_file_cut_while_written_never_takes_its_final_name(tmp_path, monkeypatch):
    import errno
    import json

    from optuna_saturn.worker import failures

    def disk_full(obj, f):
        f.write(json.dumps(obj)[:10])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(failures.json, "dump", disk_full)
    prefix = str(tmp_path / "job-8")
    with pytest.raises(OSError):
        failures.record_failure(prefix, 0, "RuntimeError: boom", "crash")
    assert not (tmp_path / "job-8.rank0.error.json").exists() and failures.first_failure(prefix) is None
