"""The SLURM pool (``SaturnExecutor(pool=SlurmPool())``): reading an allocation from SLURM's environment, the refusal
outside one, and real sweeps inside an allocation of the two-node test cluster (``tests/slurm_cluster.py``), run as a
user runs them: ``salloc -N2 --exclusive --no-kill python script.py`` in the controller's namespace, a pool host per
node started by ``srun``."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest
import slurm_cluster
from support import require

from optuna_saturn.devices import Device
from optuna_saturn.pools.slurm import down_nodes, host_config
from optuna_saturn.pools.slurm_allocation import OUTSIDE_AN_ALLOCATION, gpus_per_node, per_node, read_allocation

HERE = os.path.dirname(os.path.abspath(__file__))


def test_slurms_per_node_counts_and_gpus_are_read_as_slurm_writes_them():
    assert per_node("2(x2)", 2, "X") == [2, 2]
    assert per_node("4,2(x3)", 4, "X") == [4, 2, 2, 2]
    with pytest.raises(RuntimeError, match="gives 2 nodes' counts, for 3"):
        per_node("2(x2)", 3, "X")
    assert gpus_per_node({"SLURM_GPUS_PER_NODE": "a100:4"}) == 4
    assert gpus_per_node({"SLURM_GPUS_ON_NODE": "2"}) == 2
    assert gpus_per_node({}) == 0


def test_outside_an_allocation_the_slurm_pool_refuses_naming_sbatch_and_salloc():
    with pytest.raises(RuntimeError) as refused:
        read_allocation("auto", env={})
    assert str(refused.value) == OUTSIDE_AN_ALLOCATION
    assert "sbatch" in OUTSIDE_AN_ALLOCATION and "salloc" in OUTSIDE_AN_ALLOCATION


_SCONTROL_NODES = (  # (scontrol --oneliner show node node0,node1 on the test cluster, shortened)
    "NodeName=node0 Arch=x86_64 CPUTot=2 NodeAddr=10.214.226.2 OS=Linux 6.18 #1 SMP State=IDLE Partitions=debug\n"
    "NodeName=node1 Arch=x86_64 CPUTot=2 NodeAddr=10.214.226.3 State=DOWN+NOT_RESPONDING Partitions=debug "
    "Reason=Not responding [slurm@2026-12-06T16:10:24]\n"
)


def test_a_node_slurm_calls_down_is_told_with_slurms_reason_and_the_others_are_not():
    assert down_nodes(_SCONTROL_NODES, ["node0", "node1"]) == {
        "node1": "SLURM says it is DOWN+NOT_RESPONDING (Not responding [slurm@2026-12-06T16:10:24])"
    }
    assert down_nodes(_SCONTROL_NODES, ["node0"]) == {}  # (not this allocation's)


def test_a_slurm_nodes_host_leases_its_devices_shared_with_its_sweeps_other_nodes_only(tmp_path, monkeypatch):
    """Two nodes of one sweep on one machine (the test cluster) share a core's lease; another sweep waits, and is
    told that a SLURM sweep's host of that node holds it."""
    from optuna_saturn.leases import LEASES_ENV, read_holders
    from optuna_saturn.pools.slurm_host import lease_of

    monkeypatch.setenv(LEASES_ENV, str(tmp_path))  # (a host sets it from its config: undone after this test)
    config = {**host_config("slurmstudy"), "leases": str(tmp_path)}
    device = Device("cpu", 0, (0,), node="node0")
    ours = lease_of(config, device.to_json())
    fellow = lease_of(config, Device("cpu", 0, (0,), node="node1").to_json())
    other = lease_of({**host_config("slurmstudy"), "leases": str(tmp_path)}, device.to_json())  # (another sweep)
    try:
        assert ours.take() is None
        assert fellow.take() is None  # (the same sweep's host of another node: shared)
        told = other.take(seconds=0.1)
        assert told is not None and "SLURM sweep of study 'slurmstudy' (its worker of node0/cpu:0" in told, told
        [(_, holder)] = read_holders(tmp_path, [device])
        assert holder is not None and holder.pool == "SLURM" and holder.device == "node0/cpu:0"
    finally:
        for lease in (ours, fellow, other):  # (a host holds them while it lives; this process lives on)
            if lease._leases is not None:
                lease._leases.release()


def _a_cluster():
    """A two-node SLURM cluster, stopped by its PIDs after."""
    require(os.geteuid() == 0, "root (network namespaces, SLURM's daemons)", fix="run the tests as root")
    missing = slurm_cluster.missing_tools()
    require(not missing, f"{', '.join(missing)} (SLURM, MUNGE, iproute2, util-linux)", fix="run .ci/install-slurm")
    folder = tempfile.mkdtemp(prefix="saturn-slurm-")  # (short: munge's socket path must fit in 108 bytes)
    try:
        yield slurm_cluster.start(folder)
    finally:
        slurm_cluster.stop(folder)
        shutil.rmtree(folder, ignore_errors=True)


own_cluster = pytest.fixture(_a_cluster)  # (of one test only: it may damage it, as a killed slurmd does)
_module_cluster = pytest.fixture(scope="module")(_a_cluster)


@pytest.fixture
def cluster(_module_cluster):
    """The module's cluster, shared by the tests that leave it as they found it (one start, not one a test): each
    finds it, and must leave it, with no job in it and both nodes idle; it fails, saying what it found, otherwise."""
    _as_found(_module_cluster, "before this test (the test before left it so)")
    yield _module_cluster
    _as_found(_module_cluster, "after this test")


def _as_found(cluster, when: str, wait: float = 30.0) -> None:
    """No job in ``squeue`` and every node idle, within ``wait`` s (a job that just ended may still be COMPLETING)."""
    deadline = time.monotonic() + wait
    while True:
        jobs = _squeue(cluster, "--format=%i %j %T %N")
        states = cluster.states()
        if not jobs and states == dict.fromkeys(cluster.nodes, "idle"):
            return
        if time.monotonic() > deadline:
            left = [line.split()[0] for line in jobs.splitlines()]
            if left:  # (cancelled, so that only this test fails, not every later one on the cluster)
                cluster.run("scancel", "--full", "--quiet", *left)
            pytest.fail(f"the shared SLURM cluster is not as found {when}: jobs {jobs!r}, nodes {states}")
        time.sleep(0.2)


def _squeue(cluster, *options: str) -> str:
    """``squeue``'s lines (an empty answer is no job only where squeue itself did not fail)."""
    done = cluster.run("squeue", "--noheader", *options)
    assert done.returncode == 0, f"squeue failed: {done.stderr}"
    return done.stdout.strip()


def _sweep_in_an_allocation(cluster, mode: str, tmp_path, extra: dict | None = None, **env: str) -> dict:
    """``slurm_pool_sweep.py MODE`` inside ``salloc -N2 --exclusive --no-kill`` (a node's failure does not end the
    allocation: the pool runs its trials elsewhere), in the controller's namespace, as a user runs a script."""
    out = tmp_path / f"{mode}.json"
    command = cluster.command(
        *(f"{k}={v}" for k, v in env.items()),
        "salloc", "-N2", "--exclusive", "--no-kill",
        sys.executable, os.path.join(HERE, "slurm_pool_sweep.py"), mode, str(out), json.dumps(extra or {}),
    )  # fmt: skip
    started = time.monotonic()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = process.communicate(timeout=200)
    except subprocess.TimeoutExpired:
        process.kill()  # (salloc; the sweep in the controller's namespace ends with the cluster)
        stdout, stderr = process.communicate()
        pytest.fail(f"{mode} did not end in 200 s:\n{stdout[-3000:]}\n{stderr[-6000:]}")
    print(f"{mode}: {time.monotonic() - started:.1f} s")
    assert process.returncode == 0, stdout[-3000:] + stderr[-6000:]
    return json.loads(out.read_text())


@pytest.mark.launch
def test_eight_trials_run_on_both_nodes_of_an_allocation_each_ddp_trial_inside_one_node(cluster, tmp_path):
    """8 DDP trials of 2 devices: all COMPLETE, on both nodes, each trial's two ranks on one node (as ``srun``
    told their worker), in that node's workers (not the executor), as one process group (the same parameters on
    both ranks); each node's host took its devices' leases there; and once the sweep ends, no host or worker is left
    in the allocation (which goes on: a script may run another sweep)."""
    leases = tmp_path / "leases"
    result = _sweep_in_an_allocation(cluster, "spread", tmp_path, OPTUNA_SATURN_LEASES=str(leases))
    trials = result["trials"]
    assert [t["state"] for t in trials] == ["COMPLETE"] * 8
    assert result["devices"] == ["node0/cpu:0", "node0/cpu:1", "node1/cpu:0", "node1/cpu:1"]
    assert {t["attrs"]["saturn:node"]["name"] for t in trials} == {"node0", "node1"}, "not spread over both nodes"
    for trial in trials:
        attrs = trial["attrs"]
        node = attrs["saturn:node"]["name"]
        assert attrs["saturn:strategy"] == "ddp" and attrs["world_size"] == 2
        assert all(d.startswith(node + "/") for d in attrs["saturn:devices"]), attrs["saturn:devices"]
        assert attrs["nodes_of_ranks"] == [node, node], attrs["nodes_of_ranks"]
        assert attrs["saturn:node"]["slurm_job"] == result["slurm_job"]
        assert result["driver_pid"] not in attrs["pids"] and len(set(attrs["pids"])) == 2
        assert attrs["max_param_diff_across_ranks"] == 0.0
    assert sorted(p.name for p in leases.iterdir() if not p.name.startswith(".")), "no host took a lease"
    assert result["left_behind"] == [], "the closed pool left processes in the allocation"


@pytest.mark.launch
def test_a_node_whose_slurmd_is_killed_mid_trial_loses_it_and_the_trial_runs_again_on_the_other(own_cluster, tmp_path):
    """node1's ``slurmd`` is killed (``kill -9``) while a trial runs there: once SLURM calls the node lost, the
    trial ends FAIL with the reason naming the node, its params run again on node0 and COMPLETE, and so does every
    other trial; nothing stays RUNNING; the lost node's host and worker, still running there, end once refused."""
    cluster = own_cluster
    result = _sweep_in_an_allocation(cluster, "node-death", tmp_path, {"run": os.path.join(cluster.folder, "run")})
    trials = {t["number"]: t for t in result["trials"]}
    victim = trials[result["victim"]]
    assert result["killed_at"] is not None
    assert victim["attrs"]["saturn:node"]["name"] == "node1" and victim["state"] == "FAIL"
    assert "SLURM node node1 is lost" in victim["attrs"]["saturn:fail_reason"], victim["attrs"]["saturn:fail_reason"]
    again = [t for t in trials.values() if t["attrs"].get("saturn:retry_of") == victim["number"]]
    assert len(again) == 1 and again[0]["state"] == "COMPLETE", again
    assert again[0]["attrs"]["saturn:node"]["name"] == "node0" and again[0]["attrs"]["ran_on"] == "node0"
    others = [t for t in trials.values() if t is not victim and t not in again]
    assert len(others) == 2 and all(t["state"] == "COMPLETE" for t in others), others
    assert not [t for t in trials.values() if t["state"] in ("RUNNING", "WAITING")]
    # node1's slurmd is gone, not node1: its worker, which no step can reach now, is refused by the pool once its
    # trial ends there, and exits; its host gives up and exits too
    assert result["left_behind"] == [], result["left_behind"]


@pytest.mark.launch
def test_under_a_deadline_the_node_no_trial_left_needs_goes_back_to_slurm_before_the_sweep_ends(cluster, tmp_path):
    """Three 5 s trials on a device of each node of ``salloc -N2``, a deadline of an hour (one node suffices): while
    the sweep still runs, ``sinfo`` shows the node given back IDLE (the other still ALLOCATED), the job holds the
    other only, no trial starts on the given-back node after, and all COMPLETE. The user's script then sees the job as
    it is (SLURM's resize script applied: a plain ``srun`` works)."""
    result = _sweep_in_an_allocation(cluster, "release", tmp_path, SATURN_TEST_SLEEPY_STEPS="50")
    assert [t["state"] for t in result["trials"]] == ["COMPLETE"] * 3
    released = result["summary"]["released"]
    assert len(released) == 1, result["summary"]
    [(device, released_at)] = released.items()
    given, kept = device.split("/")[0], {"node0": "node1", "node1": "node0"}[device.split("/")[0]]
    during = [states for at, states in result["states_seen"] if at < result["ended_at"] - 0.5]
    assert {given: "idle", kept: "alloc"} in during, result["states_seen"]
    assert result["job_nodelist"] == kept
    assert result["plain_srun"][:2] == [0, kept], result["plain_srun"]
    late = [t for t in result["trials"] if t["attrs"]["saturn:actual_start"] >= released_at]
    assert all(t["attrs"]["saturn:node"]["name"] == kept for t in late)
    assert result["left_behind"] == [], result["left_behind"]


def test_slurms_resize_script_is_applied_as_a_shell_would(tmp_path, monkeypatch):
    """``scontrol update`` run in the job writes ``slurm_job_N_resize.sh`` in its working folder; ``shrink`` runs it
    in a temporary folder (never the user's) and applies it to the environment given: exports and unsets."""
    from optuna_saturn.pools import slurm_job

    def scontrol(arguments, *, cwd=None):
        assert arguments == ["update", "JobId=7", "NodeList=node0"] and cwd is not None and cwd != os.getcwd()
        (tmp_path / "cwd").write_text(cwd)
        script = 'export SLURM_NODELIST="node0"\nexport SLURM_NNODES=1\nunset SLURM_TASKS_PER_NODE\n'
        with open(os.path.join(cwd, "slurm_job_7_resize.sh"), "w") as f:
            f.write(script)
        return ""

    monkeypatch.setattr(slurm_job, "scontrol", scontrol)
    env = {"SLURM_JOB_ID": "7", "SLURM_NODELIST": "node[0-1]", "SLURM_NNODES": "2", "SLURM_TASKS_PER_NODE": "2(x2)"}
    slurm_job.shrink("7", ["node0"], env)
    assert env == {"SLURM_JOB_ID": "7", "SLURM_NODELIST": "node0", "SLURM_NNODES": "1"}
    assert not os.path.exists((tmp_path / "cwd").read_text()), "the temporary folder was left"
    other = {"SLURM_JOB_ID": "8", "SLURM_NNODES": "2"}
    slurm_job.shrink("7", ["node0"], other)  # (another job's environment: untouched)
    assert other == {"SLURM_JOB_ID": "8", "SLURM_NNODES": "2"}


def _printing_what_it_raises(cluster, imports: str, call: str, raised: type[Exception]) -> subprocess.CompletedProcess:
    """``call`` (after ``imports``) in a Python of the controller's namespace, as a user's script runs it there; what
    it raises of ``raised`` it prints, and exits 0."""
    script = f"{imports}\ntry:\n    {call}\nexcept {raised.__name__} as exc:\n    print(exc)\n"
    return subprocess.run(
        cluster.command(sys.executable, "-c", script), capture_output=True, text=True, timeout=120, check=False
    )


def _our_jobs(cluster) -> str:
    """``squeue``'s lines of the jobs the pool asks for (named optuna-saturn), running or queued."""
    return _squeue(cluster, "--name=optuna-saturn", "--format=%i %T %N")


@pytest.mark.launch
def test_outside_an_allocation_the_slurm_pool_asks_slurm_for_two_nodes_and_ends_its_job_after(cluster, tmp_path):
    """The example's GPT-2, 4 trials, from a script run outside any allocation: ``SlurmPool(nodes=2, ...)`` asks
    SLURM for the nodes (``salloc``), every trial COMPLETEs, on both nodes, in the job SLURM started for it; once the
    sweep ends, ``squeue`` shows no job of the pool's and no host or worker is left on the nodes."""
    out = tmp_path / "outside.json"
    command = cluster.command(sys.executable, os.path.join(HERE, "slurm_pool_sweep.py"), "outside", str(out))
    done = subprocess.run(command, capture_output=True, text=True, timeout=250, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    assert "SLURM started job" in done.stderr, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert [t["state"] for t in result["trials"]] == ["COMPLETE"] * 4
    assert result["devices"] == ["node0/cpu:0", "node0/cpu:1", "node1/cpu:0", "node1/cpu:1"]
    assert {t["attrs"]["saturn:node"]["name"] for t in result["trials"]} == {"node0", "node1"}
    assert {t["attrs"]["saturn:node"]["slurm_job"] for t in result["trials"]} == {result["slurm_job"]}
    assert result["left_behind"] == [], result["left_behind"]
    assert result["queue_after"] == "", "the job outlived the sweep"
    assert _our_jobs(cluster) == ""
    assert cluster.job_state(result["slurm_job"]) in ("CANCELLED", "COMPLETED", ""), "the job did not end"


@pytest.mark.launch
def test_a_partition_slurm_does_not_know_is_refused_in_slurms_words_and_nothing_stays_queued(cluster):
    """``SlurmPool(nodes=2, partition="nope")``: the executor's constructor raises with SLURM's own message and the
    fix, and no job of the pool's is left in ``squeue``."""
    done = _printing_what_it_raises(
        cluster,
        "from optuna_saturn import SaturnExecutor\nfrom optuna_saturn.pools import SlurmPool",
        "SaturnExecutor(devices=1, pool=SlurmPool(nodes=2, partition='nope', time='5:00'), dashboard=False)",
        RuntimeError,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "SLURM did not start the pool's job (salloc --nodes=2" in done.stdout, done.stdout
    assert "Invalid partition name specified" in done.stdout and "sinfo lists the partitions" in done.stdout
    assert _our_jobs(cluster) == ""


def test_slurm_pool_options_are_checked_and_turned_into_salloc_options():
    from optuna_saturn.pools import SlurmPool
    from optuna_saturn.pools.slurm_request import SlurmRequest

    with pytest.raises(ValueError, match="pass nodes= too"):
        SlurmPool(partition="gpu")
    with pytest.raises(ValueError, match="whole number of at least 1"):
        SlurmPool(nodes=0)
    with pytest.raises(ValueError, match="takes a list of options"):
        SlurmPool(nodes=1, salloc_options="--account=lab")
    asked = SlurmRequest(nodes=2, partition="gpu", time_limit="1:00:00", gpus_per_node=4, salloc_options=["-A", "x"])
    command = asked.command()
    assert command[: command.index(sys.executable)] == [
        "salloc", "--nodes=2", "--ntasks-per-node=1", "--exclusive", "--partition=gpu", "--time=1:00:00",
        "--gpus-per-node=4", "--no-kill", "--job-name=optuna-saturn", "-A", "x",
    ]  # fmt: skip
    again = SlurmRequest(nodes=2, cpus_per_node=8).command(["node3", "node4"])
    assert "--cpus-per-task=8" in again and "--exclusive" not in again and "--nodelist=node3,node4" in again


@pytest.mark.launch
def test_a_job_slurm_cannot_start_is_waited_for_with_its_reason_then_cancelled_at_the_start_timeout(cluster):
    """3 nodes of a 2-node partition: SLURM queues the job and never starts it; the pool says why it waits
    (``squeue``'s state and reason), and at ``start_timeout`` raises naming both and cancels it: nothing stays
    queued."""
    done = _printing_what_it_raises(
        cluster,
        "from optuna_saturn import SaturnExecutor\nfrom optuna_saturn.pools import SlurmPool, slurm_request\n"
        "slurm_request.PROGRESS_SECONDS = 1.0",
        "SaturnExecutor(devices=1, pool=SlurmPool(nodes=3, start_timeout=4), dashboard=False)",
        TimeoutError,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "waiting for SLURM to start job" in done.stderr and ": PENDING (PartitionNodeLimit)" in done.stderr, (
        done.stderr[-3000:]
    )
    assert "in 4 s (PENDING (PartitionNodeLimit)); it is cancelled" in done.stdout, done.stdout
    assert _our_jobs(cluster) == ""


@pytest.mark.launch
def test_a_request_given_up_on_before_slurm_starts_its_job_cancels_the_job_itself(cluster):
    """The request's own promise, whoever calls it (the executor's construction closes its pool on an error too,
    which hides a request that leaves its job behind; a second sweep's request has no such net): ``start`` that
    times out while SLURM queues the job cancels it before raising. ``salloc`` runs in a session of its own, so a
    job left queued would outlive the process that asked for it."""
    done = _printing_what_it_raises(
        cluster,
        "from optuna_saturn.pools.slurm_request import SlurmRequest",
        "SlurmRequest(nodes=3, start_timeout=2).start()",
        TimeoutError,
    )
    assert done.returncode == 0 and "it is cancelled" in done.stdout, (done.stdout, done.stderr[-3000:])
    left = _our_jobs(cluster)
    if left:  # (cancelled here, so that the module's next test finds the cluster as it was)
        cluster.run("scancel", "--name=optuna-saturn")
    assert left == "", f"the job was left queued: {left}"


def test_pool_options_of_the_command_line_make_the_runners_pool_or_name_what_it_takes():
    from optuna_saturn.cli.app import pool_arguments
    from optuna_saturn.pools.options import pool_from_options

    pool = pool_from_options("slurm", ["nodes=2", "partition=gpu", "time=4:00:00", "salloc_options=--qos=high -A x"])
    assert pool.nodes == 2 and pool._request is not None
    assert (pool._request.partition, pool._request.time_limit) == ("gpu", "4:00:00")
    assert pool._request.salloc_options == ("--qos=high", "-A", "x")
    with pytest.raises(ValueError, match="takes no option 'gpus'; it takes channel_host, cpus_per_node, gpus_per_node"):
        pool_from_options("slurm", ["gpus=4"])
    with pytest.raises(ValueError, match="takes KEY=VALUE, got 'nodes'"):
        pool_from_options("slurm", ["nodes"])
    assert pool_arguments("ray", "10.0.0.1:6379", ()) == {"runner": "ray", "ray_address": "10.0.0.1:6379"}
    assert pool_arguments("slurm", None, ()) == {"runner": "slurm", "ray_address": None}


@pytest.mark.launch
def test_the_command_line_asks_slurm_for_nodes_and_says_slurms_refusal_without_a_traceback(cluster, tmp_path):
    """``optuna-saturn run ... --runner slurm --pool-option nodes=2 --pool-option partition=nope``: exit code 2, SLURM's
    words on stderr, no traceback, nothing queued."""
    objective = tmp_path / "objective.py"
    objective.write_text("def objective(trial):\n    return trial.suggest_float('x', 0, 1)\n")
    command = cluster.command(
        sys.executable, "-c", "from optuna_saturn.cli import main; main()", "run", f"{objective}:objective",
        "--n-trials", "1",
        "--storage", f"sqlite:///{tmp_path}/s.db", "--study", "s", "--runner", "slurm",
        "--pool-option", "nodes=2", "--pool-option", "partition=nope", "--no-dashboard",
    )  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Invalid partition name specified" in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert _our_jobs(cluster) == ""


@pytest.mark.launch
def test_a_job_the_pool_asked_for_ends_when_the_executors_process_is_killed(cluster):
    """``kill -9`` of the process whose pool asked SLURM for nodes (no ``finally`` runs): its watcher sees it gone
    and ``salloc`` gives the nodes back, in seconds, not at the job's time limit."""
    script = (
        "from optuna_saturn import SaturnExecutor\n"
        "from optuna_saturn.pools import SlurmPool\n"
        "import time\n"
        "SaturnExecutor(devices=1, pool=SlurmPool(nodes=2, time='30:00'), dashboard=False)\n"
        "print('allocated', flush=True)\n"
        "time.sleep(600)\n"
    )
    process = subprocess.Popen(
        cluster.command(sys.executable, "-c", script), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None and process.stdout.readline().strip() == "allocated", process.stderr
        assert " RUNNING " in _our_jobs(cluster) + " ", _our_jobs(cluster)
    finally:
        process.kill()  # (ip netns exec execs: this is the executor's process itself)
        process.wait()
    deadline = time.monotonic() + 20
    while (left := _our_jobs(cluster)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert left == "", f"the job outlived its executor: {left}"
    assert set(cluster.states().values()) == {"idle"}, cluster.states()


@pytest.mark.launch
def test_a_ctrl_c_while_slurm_queues_the_pools_job_cancels_it(cluster):
    """SIGINT (a Ctrl-C) while the pool waits for a job SLURM cannot start: the process ends with KeyboardInterrupt,
    and nothing of the pool's stays queued."""
    script = (
        "from optuna_saturn import SaturnExecutor\n"
        "from optuna_saturn.pools import SlurmPool, slurm_request\n"
        "slurm_request.PROGRESS_SECONDS = 0.5\n"
        "SaturnExecutor(devices=1, pool=SlurmPool(nodes=3), dashboard=False)\n"
    )
    process = subprocess.Popen(
        cluster.command(sys.executable, "-c", script), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert process.stderr is not None
    for line in process.stderr:  # (SLURM queued it, and the pool says so)
        if "waiting for SLURM to start job" in line:
            break
    else:
        pytest.fail(f"no progress line; the process ended with {process.wait()}")
    assert "PENDING" in _our_jobs(cluster), _our_jobs(cluster)
    process.send_signal(signal.SIGINT)
    rest = process.communicate(timeout=60)[1]
    assert process.returncode != 0 and "KeyboardInterrupt" in rest, rest[-2000:]
    assert _our_jobs(cluster) == "", "the queued job outlived the Ctrl-C"


@pytest.mark.launch
def test_a_sweep_in_a_batch_job_signalled_before_its_time_limit_queues_its_running_trials_again(own_cluster, tmp_path):
    """``sbatch --time=1 --signal=B:TERM@30`` of ``exec python script``, as clusters.md tells: 6 trials of 5 minutes
    on a device of each node; 30 s before the time limit SLURM sends the batch script (only) SIGTERM, and the sweep
    ends each running trial FAIL, "terminated", with its params WAITING again (``saturn:retry_of``) for the next
    job, and exits before the limit; nothing stays RUNNING, and no host or worker outlives the job. (At the time
    limit itself SLURM signals every step at once: the trials' workers die with the script, a race the sweep may
    see as a worker's death.)"""
    import optuna
    from optuna.trial import TrialState

    # (a fresh cluster: slurmctld looks at time limits every 30 s from its start, and one that has run longer may
    # send the job its signal at once, before any trial runs)
    cluster = own_cluster
    storage = f"sqlite:///{tmp_path}/study.db"
    sweep = f"{sys.executable} {os.path.join(HERE, 'slurm_pool_sweep.py')} time-limit {tmp_path}/o.json"
    extra = json.dumps({"storage": storage})
    submitted = cluster.run(
        "env", "SATURN_TEST_SLEEPY_STEPS=3000",
        "sbatch", "--parsable", "-N2", "--exclusive", "--no-kill", "--time=1", "--signal=B:TERM@30",
        f"--output={tmp_path}/job.out",
        f"--wrap=exec {sweep} '{extra}'",
    )  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip().split(";")[0]
    started = time.monotonic()
    state = cluster.wait_for_job(job, timeout=150)
    print(f"job {job}: {state} after {time.monotonic() - started:.1f} s")
    output = (tmp_path / "job.out").read_text()
    assert state == "FAILED" and "Terminated: signal 15" in output, (state, output[-4000:])  # (not TIMEOUT)
    trials = optuna.load_study(study_name="time-limit", storage=storage).trials
    stopped = [t for t in trials if t.state == TrialState.FAIL]
    described = [(t.number, t.state.name, t.system_attrs.get("saturn:fail_reason"), t.user_attrs) for t in trials]
    assert len(stopped) == 2, (described, output[-4000:])
    assert all("terminated" in t.system_attrs["saturn:fail_reason"] for t in stopped), described
    again = {t.user_attrs.get("saturn:retry_of"): t for t in trials if t.state == TrialState.WAITING}
    assert sorted(again) == [t.number for t in stopped], described
    assert all(again[t.number].system_attrs["fixed_params"] == t.params for t in stopped)
    assert not [t for t in trials if t.state == TrialState.RUNNING], described
    from slurm_pool_sweep import _left_behind

    assert _left_behind(job, wait=20.0) == [], "a host or worker outlived the job"
