"""Placement on a fake 4-GPU node (``tests/fake_gpu``): which GPU each rank of each trial was bound to, through
the local pool and through Ray. The per-worker mask is what puts a rank on its GPU; with the call that sets it
taken out (``benchmarks/mutations``), every rank of a node would see all four GPUs and run on the first, and these
tests fail. See ``docs/internals.md`` for what the fake can and cannot show."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys

import fake_gpu_sweep
import pytest
from support import require
from test_ray_runner import _run_in_its_own_group

from optuna_saturn.pools.launch_commands import network_isolation_prefix
from optuna_saturn.pools.worker_starts import COULD_NOT_START, START_TRIES, WORKER_START_SECONDS
from optuna_saturn.worker.gpu import LEFTOVER_BYTES

HERE = os.path.dirname(os.path.abspath(__file__))
#: The node's mask: physical GPUs 4-7, so that a worker's entry is not its pool index.
NODE_MASK = ["4", "5", "6", "7"]


def _fake_node_sweep(mode: str, tmp_path, *, timeout: float = 280, **fake: str) -> dict:
    require(bool(shutil.which("unshare") and shutil.which("ip")), "unshare or ip", fix="install util-linux, iproute2")
    out = tmp_path / f"{mode}.json"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([os.path.join(HERE, "fake_gpu"), os.environ.get("PYTHONPATH", "")]),
        "SATURN_FAKE_GPUS": str(len(NODE_MASK)),
        "CUDA_VISIBLE_DEVICES": ",".join(NODE_MASK),
        **fake,
    }
    done = _run_in_its_own_group(
        [*network_isolation_prefix(), sys.executable, os.path.join(HERE, "fake_gpu_sweep.py"), mode, str(out)],
        timeout=timeout,
        env=env,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return json.loads(out.read_text())


def _check_placement(result: dict, *, exact: bool = True) -> None:
    """Every rank of every trial ran with exactly one GPU visible, ``LOCAL_RANK`` 0 and current device 0; the
    ranks of one trial on distinct GPUs; and every process that initialised CUDA had its one-GPU mask before it
    did. ``exact``: a device's GPU is the entry of the node's mask at its index (the local pool); else the GPU Ray
    gave the rank's actor (Ray picks which of its GPUs an actor holds)."""
    trials = result["trials"]
    assert [t["state"] for t in trials] == ["COMPLETE"] * len(trials), [t["reason"] for t in trials]
    assert sorted(len(t["ranks"]) for t in trials) == [1, 1, 1, 1, 2, 2, 2, 2]
    for trial in trials:
        ranks = trial["ranks"]
        for device, rank in zip(trial["devices"], ranks):
            assert rank["mask"] in NODE_MASK, ranks  # one entry: this GPU alone
            if exact:
                assert rank["mask"] == NODE_MASK[int(device.rsplit(":", 1)[1])], (trial["devices"], ranks)
            else:  # the one Ray gave its actor
                assert rank["mask"] == rank["ray_gpu"], ranks
        assert len({r["mask"] for r in ranks}) == len(ranks), ranks
        assert {(r["local_rank"], r["current_device"], r["device"], r["initialized"]) for r in ranks} == {
            ("0", 0, "cuda:0", True)
        }, ranks
    inits = [line for line in result["log"] if line["event"] == "init"]
    assert inits and all(line["mask"] in NODE_MASK for line in inits), inits
    bound = [line for line in result["log"] if line["event"] == "set_device"]
    assert bound and {line["device"] for line in bound} == {0}, bound


@pytest.mark.launch
def test_each_rank_of_the_local_pool_runs_on_its_own_gpu_of_a_fake_four_gpu_node(tmp_path):
    """Four one-GPU trials, then four DDP trials of two GPUs, on GPUs 4-7 of a node."""
    result = _fake_node_sweep("local", tmp_path)
    _check_placement(result)
    assert {r["mask"] for t in result["trials"] for r in t["ranks"]} == set(NODE_MASK)


@pytest.mark.launch
def test_each_ray_actor_runs_on_the_gpu_ray_gave_it_when_ray_leaves_the_mask_alone(tmp_path):
    require(importlib.util.find_spec("ray") is not None, "Ray", fix="pip install 'ray[default]' (the ray extra)")
    # (a home of its own: the local cluster ray.init starts writes ~/.ray/auth_token, which made a later test's
    # two-host Ray cluster refuse its worker node, InvalidAuthToken: a CI rehearsal)
    (tmp_path / "home").mkdir()
    _check_placement(_fake_node_sweep("ray", tmp_path, HOME=str(tmp_path / "home")), exact=False)


@pytest.mark.launch
def test_a_gpu_whose_worker_cannot_start_is_given_up_and_the_sweep_goes_on_with_the_other_three(tmp_path):
    """GPU 5 (device 1) fails to create a context, as a GPU in a bad state does: its worker is given up on after
    three tries, with the reason; every trial completes on the other three GPUs, within twice the start
    time-out (the failed starts are seconds, not the time-out: a worker that exits before its hello failed)."""
    result = _fake_node_sweep("broken-one", tmp_path, SATURN_FAKE_GPU_BROKEN="5")
    trials = result["trials"]
    assert result["error"] is None and [t["state"] for t in trials] == ["COMPLETE"] * 8, result["error"]
    assert {r["mask"] for t in trials for r in t["ranks"]} == {"4", "6", "7"}
    assert not any("cuda:1" in t["devices"] for t in trials)
    failed = sum(line["event"] == "init_failed" and line["mask"] == "5" for line in result["log"])
    assert failed == 2 * START_TRIES  # (each of the two sweeps' pools tried three times)
    # it exited before its hello, whatever the time it took: a start that failed, not a job's failure
    assert result["hosts"].count(f"exited with code {COULD_NOT_START}") == 2 * START_TRIES, result["hosts"]
    assert "device 1 is given up on" in result["hosts"]
    assert result["seconds"] < 2 * WORKER_START_SECONDS, result["seconds"]


@pytest.mark.launch
def test_with_every_gpus_worker_unable_to_start_the_sweep_ends_with_the_reason(tmp_path):
    result = _fake_node_sweep("broken-all", tmp_path, SATURN_FAKE_GPU_BROKEN=",".join(NODE_MASK))
    assert result["error"] is not None and result["error"].startswith("PoolBroken: no device's worker could start")
    assert "uncorrectable ECC error" in result["error"] and "worker-0.log" in result["error"], result["error"]
    assert result["seconds"] < 2 * WORKER_START_SECONDS, result["seconds"]


@pytest.mark.launch
def test_workers_that_hang_at_their_start_are_given_up_after_the_start_time_out(tmp_path):
    """Every GPU's context creation hangs (a driver call that never returns): no worker exits, so only the pool's
    own clock can tell; the sweep ends with the reason after the start time-out, well within twice it."""
    # (a sweep that waits for ever is killed at eight times the time-out: the test then fails at once)
    result = _fake_node_sweep(
        "hangs", tmp_path, timeout=8 * fake_gpu_sweep.HANG_START_TIMEOUT, SATURN_FAKE_GPU_HANGS=",".join(NODE_MASK)
    )
    timeout = fake_gpu_sweep.HANG_START_TIMEOUT
    assert result["error"] is not None and f"did not start within {timeout:.0f} s" in result["error"], result["error"]
    assert timeout <= result["seconds"] < 2 * timeout, result["seconds"]


@pytest.mark.launch
def test_a_worker_whose_gpu_still_holds_memory_after_a_job_is_replaced_before_the_next(tmp_path):
    """A job that leaves 100 MiB referenced on its GPU keeps its worker (under the 256 MiB threshold); one that
    leaves 300 MiB has it replaced, so the next trial does not start with that memory held."""
    result = _fake_node_sweep("leaks", tmp_path)
    trials = result["trials"]
    assert [t["state"] for t in trials] == ["COMPLETE"] * 3, [t["reason"] for t in trials]
    first, second, third = (t["ranks"][0]["pid"] for t in trials)
    assert first == second and third != second, (first, second, third)
    assert LEFTOVER_BYTES == 256 * 2**20 and 100 * 2**20 < LEFTOVER_BYTES < 300 * 2**20
