"""The SLURM pool's own job and its release where SLURM's commands fail, without a cluster: ``salloc``, ``scancel``
and ``scontrol`` are small scripts on the PATH that answer as SLURM does and write down how they were called
(the real-cluster tests are in ``tests/test_slurm_pool.py``)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from optuna_saturn import SaturnExecutor
from optuna_saturn.pools import slurm as slurm_workers
from optuna_saturn.pools.slurm_kind import SlurmPool
from optuna_saturn.pools.slurm_request import SlurmRequest

_SALLOC = """
import itertools, json, os, pathlib, subprocess, sys
log = pathlib.Path(os.environ["FAKE_SLURM_LOG"])
job = str(7 + sum(1 for line in log.read_text().splitlines() if line.startswith('["salloc"'))) if log.exists() else "7"
with log.open("a") as out:
    out.write(json.dumps(["salloc", *sys.argv[1:]]) + "\\n")
command = list(itertools.dropwhile(lambda word: word.startswith("--"), sys.argv[1:]))
print(f"salloc: Granted job allocation {job}", file=sys.stderr, flush=True)
nodes = int(os.environ.get("FAKE_SLURM_NODES", "2"))
env = {**os.environ, "SLURM_JOB_ID": job, "SLURM_JOB_NODELIST": f"node[0-{nodes - 1}]"}
env["SLURM_JOB_CPUS_PER_NODE"] = f"1(x{nodes})"
sys.exit(subprocess.call(command, env=env))
"""
_SCANCEL = """
import json, os, sys
with open(os.environ["FAKE_SLURM_LOG"], "a") as out:
    out.write(json.dumps(["scancel", *sys.argv[1:]]) + "\\n")
"""
_SCONTROL = """
import os, sys
words = [w for w in sys.argv[1:] if w != "--oneliner"]
if words[:2] == ["show", "hostnames"]:
    print("\\n".join(f"node{i}" for i in range(int(os.environ.get("FAKE_SLURM_NODES", "2")))))
elif words[:2] == ["show", "node"]:
    for name in words[2].split(","):
        print(f"NodeName={name} NodeAddr=127.0.0.1 State=ALLOCATED")
elif words[:2] == ["show", "job"]:
    print(f"JobId={words[2]} BatchFlag=0 NodeList=node[0-{int(os.environ.get('FAKE_SLURM_NODES', '2')) - 1}]")
else:
    sys.exit(f"scontrol: error: {' '.join(words)} not faked")
"""


@pytest.fixture
def fake_slurm(tmp_path, monkeypatch) -> Path:
    """SLURM's commands, faked on the PATH; returns the file their calls are written to (one JSON list a line)."""
    folder = tmp_path / "bin"
    folder.mkdir()
    for name, source in (("salloc", _SALLOC), ("scancel", _SCANCEL), ("scontrol", _SCONTROL)):
        script = folder / name
        script.write_text(f"#!{sys.executable}\n{textwrap.dedent(source)}")
        script.chmod(0o755)
    log = tmp_path / "slurm-calls.jsonl"
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SLURM_LOG", str(log))
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    return log


def _calls(log: Path, command: str) -> list[list[str]]:
    lines = log.read_text().splitlines() if log.exists() else []
    return [call[1:] for call in map(json.loads, lines) if call[0] == command]


def test_a_second_executor_of_one_slurm_pool_runs_on_its_live_job_and_slurm_is_asked_once(fake_slurm):
    pool = SlurmPool(nodes=2, channel_host="127.0.0.1")
    try:
        first = pool.place("auto", allow_shared_cores=True)
        second = pool.place("auto", allow_shared_cores=True)
        assert len(_calls(fake_slurm, "salloc")) == 1
        assert first.found.job_id == second.found.job_id == "7"
        assert [n.name for n in second.found.nodes] == ["node0", "node1"]
    finally:
        pool.close()
    assert _calls(fake_slurm, "scancel") == [["7"]]
    assert pool._request is not None and not pool._request.running()


def test_asking_for_the_job_again_while_it_runs_ends_the_first_one(fake_slurm):
    request = SlurmRequest(nodes=2)
    request.start()
    first = request._salloc
    assert first is not None
    try:
        assert request.start()["SLURM_JOB_ID"] == "8"
        assert _calls(fake_slurm, "scancel") == [["7"]]
        assert first.poll() is not None  # (its salloc, and so the job, ended: none left out of reach)
    finally:
        request.end()
    assert _calls(fake_slurm, "scancel") == [["7"], ["8"]]


def test_an_executor_whose_construction_fails_after_slurm_gave_it_nodes_ends_that_job(fake_slurm):
    pool = SlurmPool(nodes=2, channel_host="127.0.0.1")
    with pytest.raises(ValueError, match="no-such-strategy"):
        SaturnExecutor(pool=pool, strategies=["no-such-strategy"], progress=None)
    assert len(_calls(fake_slurm, "salloc")) == 1
    assert _calls(fake_slurm, "scancel") == [["7"]]
    assert pool._request is not None and not pool._request.running()


def test_an_scancel_that_times_out_still_ends_the_salloc_holding_the_job(fake_slurm, monkeypatch, caplog):
    request = SlurmRequest(nodes=2)
    request.start()
    salloc = request._salloc
    assert salloc is not None

    def timing_out(command, **kwargs):
        raise subprocess.TimeoutExpired(command, kwargs.get("timeout", 60))

    monkeypatch.setattr(subprocess, "run", timing_out)
    with caplog.at_level(logging.WARNING, logger="optuna.saturn"):
        request.end()  # (no error: it runs from a finally, where it would hide the sweep's own)
    assert salloc.poll() is not None and not request.running()
    assert "scancel 7 failed" in caplog.text and "timed out" in caplog.text


@pytest.fixture
def workers(fake_slurm, tmp_path, monkeypatch) -> slurm_workers.SlurmWorkers:
    """A three-node pool's workers, every device of a node not lost idle and ready; closing a node writes it down."""
    monkeypatch.setenv("FAKE_SLURM_NODES", "3")
    pool = SlurmPool(nodes=3, channel_host="127.0.0.1")
    placement = pool.place("auto", allow_shared_cores=True)
    workers = slurm_workers.SlurmWorkers(placement.found, log_dir=tmp_path, on_close=pool.close)
    for node in workers._nodes:
        monkeypatch.setattr(
            node, "ready", lambda node=node: set() if node.lost_because else {*range(len(node.devices))}
        )
        monkeypatch.setattr(node, "close", lambda node=node: workers.closed.append(node.node.name))
    workers.closed = []  # type: ignore[attr-defined]
    yield workers
    workers._on_close()


def _refusing(*args, **kwargs):
    raise RuntimeError("scontrol update JobId=7 NodeList=node0 failed: Requested operation is presently disabled")


def test_a_node_slurm_refuses_to_take_back_is_not_reported_given_and_its_devices_are_lost(workers, monkeypatch, caplog):
    """Three nodes, all idle: SLURM refuses the first shrink. That node's host is stopped already, so its devices
    are lost (not ready, not given back); the others are not tried then. A later release gives node1 back and keeps
    node2, the one node left to run on (node0, still the job's, runs nothing)."""
    monkeypatch.setattr(slurm_workers, "shrink", _refusing)
    everything = set(range(len(workers.devices)))
    on = {name: {i for i, d in enumerate(workers.devices) if d.node == name} for name in ("node0", "node1", "node2")}
    with caplog.at_level(logging.WARNING, logger="optuna.saturn.runner"):
        assert workers.release(everything) == set()
    assert workers.closed == ["node0"]  # (its host stopped before SLURM was asked; node1's and node2's were not)
    assert workers.lost() == on["node0"] and workers.ready() == on["node1"] | on["node2"]
    assert "SLURM node node0 could not be given back" in caplog.text
    assert "Requested operation is presently disabled" in caplog.text
    shrunk: list[list[str]] = []
    monkeypatch.setattr(slurm_workers, "shrink", lambda job, keep: shrunk.append(keep))
    assert workers.release(everything - on["node0"]) == on["node1"]
    assert shrunk == [["node0", "node2"]] and workers.closed == ["node0", "node1"]


def test_an_scontrol_failure_before_a_release_gives_nothing_back_and_the_sweep_runs_on(workers, monkeypatch, caplog):
    shrunk: list[list[str]] = []
    monkeypatch.setattr(slurm_workers, "fixed_node", _refusing)
    monkeypatch.setattr(slurm_workers, "shrink", lambda job, keep: shrunk.append(keep))
    with caplog.at_level(logging.WARNING, logger="optuna.saturn.runner"):
        assert workers.release(set(range(len(workers.devices)))) == set()
    assert workers.closed == [] and shrunk == [] and workers.lost() == set()
    assert "SLURM job 7's nodes are not given back now" in caplog.text and "presently disabled" in caplog.text
    monkeypatch.setattr(slurm_workers, "fixed_node", lambda job: None)  # (SLURM answers again: asked again)
    assert workers.release(set(range(len(workers.devices))))
    assert shrunk == [["node1", "node2"], ["node2"]]  # (node0 and node1 went back; node2 is kept to run on)
