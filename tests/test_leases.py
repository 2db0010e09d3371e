"""Two sweeps on one machine never run on one device at once: a sweep leases its devices, one whose devices
another holds waits for them and says who holds them, and a holder killed with ``kill -9`` frees them at once
(reliability review: two sweeps on one machine both used every device)."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time

import optuna
import pytest
from optuna.trial import TrialState

from optuna_saturn import leases
from optuna_saturn.devices import Device
from optuna_saturn.leases import DeviceLeases, current_leases

HERE = os.path.dirname(__file__)
DEVICES = [Device("cpu", 0), Device("cpu", 1)]


@pytest.fixture
def lease_folder(tmp_path, monkeypatch):
    folder = tmp_path / "leases"
    monkeypatch.setenv(leases.LEASES_ENV, str(folder))
    return folder


def test_a_device_held_by_one_sweep_is_not_leased_to_another_until_it_is_released(lease_folder):
    first = DeviceLeases(DEVICES, folder=lease_folder, study="first")
    assert first.take_free() == []
    second = DeviceLeases(DEVICES[1:], folder=lease_folder, study="second")
    assert second.take_free() == DEVICES[1:]
    said = []
    assert not second.wait_for_all(deadline=time.monotonic(), say=said.append)
    assert "cpu:1 by" in said[0] and "study 'first'" in said[0] and f"pid {os.getpid()}" in said[0]
    assert [(name, holder.study) for name, holder in current_leases(lease_folder)] == [
        ("cpu-0", "first"),
        ("cpu-1", "first"),
    ]
    first.release()
    assert second.take_free() == []
    assert [holder.study for _, holder in current_leases(lease_folder)] == ["second"]
    second.release()
    assert current_leases(lease_folder) == []
    assert oct(lease_folder.stat().st_mode & 0o7777) == "0o1777"  # (every user's sweeps lease there)


def test_a_sweep_takes_all_its_devices_or_none_so_two_never_wait_for_each_other(lease_folder):
    """Two sweeps that each took half of their devices would each wait for the other's half for ever."""
    other = DeviceLeases(DEVICES[1:], folder=lease_folder, study="other")
    assert other.take_free() == []
    waiting = DeviceLeases(DEVICES, folder=lease_folder, study="waiting")
    assert waiting.take_free() == DEVICES[1:]
    assert [name for name, _ in current_leases(lease_folder)] == ["cpu-1"]  # (cpu:0 was let go)
    other.release()
    assert waiting.take_free() == []
    waiting.release()


def test_devices_are_leased_by_their_hardware_not_by_their_number_in_one_sweep(monkeypatch):
    """A sweep with CUDA_VISIBLE_DEVICES=1 calls the machine's second GPU cuda:0; CPU devices of two sweeps that
    split the cores differently share cores, not numbers."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    monkeypatch.setattr(leases.nvml, "uuid_of", lambda entry: {"1": "GPU-second"}.get(entry))
    assert leases.lease_names(Device("cuda", 0)) == ["cuda-GPU-second.lease"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-abc,GPU-xyz")
    assert leases.lease_names(Device("cuda", 1)) == ["cuda-GPU-xyz.lease"]
    wide, narrow = Device("cpu", 0, (0, 1, 2, 3)), Device("cpu", 1, (2, 3))
    assert set(leases.lease_names(wide)) & set(leases.lease_names(narrow)) == {"cpu-core-2.lease", "cpu-core-3.lease"}


def test_a_forked_child_does_not_keep_its_parents_leases(lease_folder):
    """The pool host and its workers are forks of the executor: a lease lives while any copy of its descriptor is
    open, so a child that kept one would hold the device after the sweep was killed."""
    held = DeviceLeases(DEVICES[:1], folder=lease_folder, study="parent")
    assert held.take_free() == []
    ready, said = os.pipe()
    child = os.fork()
    if child == 0:  # (the fork's hooks ran before os.fork returned here)
        os.write(said, b"up")
        time.sleep(30)
        os._exit(0)
    try:
        assert os.read(ready, 2) == b"up"
        held.release()
        assert DeviceLeases(DEVICES[:1], folder=lease_folder, study="next").take_free() == []
    finally:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)


def _sweep(storage: str, study: str, steps: int, log, output) -> subprocess.Popen:
    command = [os.path.join(os.path.dirname(sys.executable), "optuna-saturn"), "run", "objectives:sleepy"]
    command += ["--storage", storage, "--study", study, "--devices", "2", "--strategies", "single", "--n-trials", "2"]
    command += ["--no-profile", "--progress", "plain", "--no-dashboard", "--isolate-network", "--log-dir", str(log)]
    return subprocess.Popen(
        command,
        env={
            **os.environ,
            "SATURN_TEST_SLEEPY_STEPS": str(steps),
            "PYTHONPATH": os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")]),
        },
        stdout=output,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _studies(folder) -> set[str]:
    return {holder.study for _, holder in current_leases(folder) if holder is not None}


def _wait_for(condition, seconds: float, what: str) -> float:
    began = time.monotonic()
    while not condition():
        assert time.monotonic() - began < seconds, what
        time.sleep(0.05)
    return time.monotonic() - began


@pytest.mark.launch
def test_two_sweeps_on_the_same_devices_take_turns_and_a_killed_one_frees_them_at_once(lease_folder, tmp_path):
    """Two executors, two studies, the same 2 CPU devices: the second waits, saying who holds them; killed with
    kill -9, the first frees them to the second within 5 s; no device ever runs two trials at once, and the
    second completes every trial."""
    storage = f"sqlite:///{tmp_path / 'studies.sqlite3'}"
    said = tmp_path / "second.out"
    with open(tmp_path / "first.out", "w") as first_out:  # (a minute: it holds the devices until killed)
        first = _sweep(storage, "first", 600, tmp_path / "first", first_out)
    try:
        _wait_for(lambda: _studies(lease_folder) == {"first"}, 60, "the first sweep did not lease its devices")
        _wait_for(
            lambda: optuna.load_study(study_name="first", storage=storage).get_trials(states=(TrialState.RUNNING,)),
            90,
            "the first sweep's trials did not start",
        )
        with open(said, "w") as second_out:
            second = _sweep(storage, "second", 5, tmp_path / "second", second_out)
        _wait_for(lambda: "Waiting for devices" in said.read_text(), 90, "the second sweep did not wait")
        assert _studies(lease_folder) == {"first"}
        os.killpg(first.pid, signal.SIGKILL)
        freed = _wait_for(
            lambda: _studies(lease_folder) == {"second"}, 30, "the killed sweep's devices were not leased to the second"
        )
        assert freed < 5.0, freed
        second.wait(timeout=180)
    finally:
        for process in (first,):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
    output = said.read_text()
    assert second.returncode == 0, output[-3000:]
    assert "Waiting for devices another sweep on this machine holds" in output and "study 'first'" in output
    trials = optuna.load_study(study_name="second", storage=storage).trials
    assert [t.state for t in trials] == [TrialState.COMPLETE, TrialState.COMPLETE]
    first_runs = optuna.load_study(study_name="first", storage=storage).trials
    killed_at = max(t.datetime_start for t in first_runs if t.datetime_start)
    assert all(t.datetime_start > killed_at for t in trials)  # nothing of the second ran beside the first


def test_optuna_saturn_devices_shows_who_holds_what(lease_folder):
    held = DeviceLeases(DEVICES[:1], folder=lease_folder, study="mine")
    assert held.take_free() == []
    command = [os.path.join(os.path.dirname(sys.executable), "optuna-saturn"), "devices"]
    shown = subprocess.run(command, capture_output=True, text=True, timeout=60, check=True).stdout
    assert "cpu-0:" in shown and "sweep of study 'mine'" in shown and f"pid {os.getpid()}" in shown
    held.release()
    shown = subprocess.run(command, capture_output=True, text=True, timeout=60, check=True).stdout
    assert "No sweep on this machine holds a device now" in shown


def test_a_lease_file_is_open_to_every_user_even_if_its_creator_dies_before_its_lock(lease_folder):
    """It was made under the umask (0644) and opened to all only once locked: a creator killed in between left a
    private file, and every other user's sweep on that device stopped with "another user made it private"."""
    leases.shared_folder(lease_folder)
    child = os.fork()
    if child == 0:  # (a sweep under umask 022, killed right after the lease file exists, before its flock)
        os.umask(0o022)
        leases._open_lease(lease_folder / "cpu-core-0.lease")
        os._exit(0)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert [(p.name, oct(p.stat().st_mode & 0o777)) for p in lease_folder.iterdir()] == [("cpu-core-0.lease", "0o666")]
    held = DeviceLeases([Device("cpu", 0, (0,))], folder=lease_folder, study="next")
    assert held.take_free() == []
    held.release()


@pytest.mark.parametrize("where", ["shared_folder", "_create_open_to_all"])
def test_a_lease_folder_that_takes_no_file_says_so_and_names_the_way_around(lease_folder, monkeypatch, where):
    """A full file system (no free inode: r14) under the lease folder raised a bare OSError from optimize."""

    def full(path, *args):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(leases, where, full)
    with pytest.raises(RuntimeError) as refused, leases.leased(DEVICES, study="s", deadline=None, say=print):
        pass
    message = str(refused.value)
    assert f"Cannot make a device lease in {lease_folder} (No space left on device)" in message
    assert "set OPTUNA_SATURN_LEASES to another folder (or to off" in message
