"""Mutations of the SLURM pool (``optuna_saturn/pools/slurm*.py``): each undoes one thing a sweep inside a SLURM
allocation needs (the allocation read as SLURM writes it, the refusal outside one, each node's own rendezvous, the
leases each node's host takes, a lost node's trials ended and run again)."""

from mutations import Mutation

_TESTS = "tests/test_slurm_pool.py"
_SPREAD = f"{_TESTS}::test_eight_trials_run_on_both_nodes_of_an_allocation_each_ddp_trial_inside_one_node"
_DEATH = f"{_TESTS}::test_a_node_whose_slurmd_is_killed_mid_trial_loses_it_and_the_trial_runs_again_on_the_other"
_RELEASE = f"{_TESTS}::test_under_a_deadline_the_node_no_trial_left_needs_goes_back_to_slurm_before_the_sweep_ends"
_OUTSIDE = f"{_TESTS}::test_outside_an_allocation_the_slurm_pool_asks_slurm_for_two_nodes_and_ends_its_job_after"
_PARTITION = f"{_TESTS}::test_a_partition_slurm_does_not_know_is_refused_in_slurms_words_and_nothing_stays_queued"
_NO_START = f"{_TESTS}::test_a_job_slurm_cannot_start_is_waited_for_with_its_reason_then_cancelled_at_the_start_timeout"

MUTATIONS: list[Mutation] = [
    Mutation(
        name="slurm-counts-per-node-misread",
        contract="SLURM's compressed per-node counts ('2(x2)') give one count per node",
        path="optuna_saturn/pools/slurm_allocation.py",
        old="counts += [int(match[1])] * int(match[2] or 1)",
        new="counts += [int(match[1])]",
        tests=(f"{_TESTS}::test_slurms_per_node_counts_and_gpus_are_read_as_slurm_writes_them", _SPREAD),
    ),
    Mutation(
        name="slurm-outside-an-allocation-accepted",
        contract="outside an allocation the SLURM pool refuses, naming sbatch and salloc",
        path="optuna_saturn/pools/slurm_allocation.py",
        old="    if not job:\n        raise RuntimeError(OUTSIDE_AN_ALLOCATION)\n",
        new="",
        tests=(f"{_TESTS}::test_outside_an_allocation_the_slurm_pool_refuses_naming_sbatch_and_salloc",),
    ),
    Mutation(
        name="slurm-down-node-missed",
        contract="a node SLURM calls DOWN (with a flag such as +NOT_RESPONDING) is told as down",
        path="optuna_saturn/pools/slurm.py",
        old='("DOWN" in state or "FAIL" in state)',
        new='state in ("DOWN", "FAIL")',
        tests=(f"{_TESTS}::test_a_node_slurm_calls_down_is_told_with_slurms_reason_and_the_others_are_not",),
    ),
    Mutation(
        name="slurm-nodes-share-rendezvous-files",
        contract="each node's jobs meet through rendezvous files of their own (two nodes' DDP jobs run at once)",
        path="optuna_saturn/pools/slurm_node.py",
        old='self._name = f"pool-{node.name}"',
        new='self._name = "pool"',
        tests=(_SPREAD,),
    ),
    Mutation(
        name="slurm-host-takes-no-lease",
        contract="each node's pool host takes its devices' leases on its node before its workers start",
        path="optuna_saturn/pools/slurm_host.py",
        old='leases = [lease_of(config, device) for device in config["devices"]]',
        new="leases: list = []",
        tests=(_SPREAD,),
    ),
    Mutation(
        name="slurm-lost-node-trials-not-ended",
        contract="a lost node's running jobs end unclean with the reason (the sweep runs their trials again)",
        path="optuna_saturn/pools/slurm_node.py",
        old="self._rank_ended(job, device, False, reason)\n            for worker in self._workers:",
        new="pass\n            for worker in self._workers:",
        tests=(_DEATH,),
    ),
    Mutation(
        name="slurm-close-leaves-hosts",
        contract="a closed SLURM pool leaves no host or worker in the allocation (which runs on)",
        path="optuna_saturn/pools/slurm_node.py",
        old="        super().close()\n",
        new="",
        tests=(_SPREAD,),
    ),
    Mutation(
        name="slurm-lost-node-workers-not-told-to-exit",
        contract="a lost node's workers, which no step reaches, are told to exit at their next request",
        path="optuna_saturn/pools/slurm_node.py",
        old='                worker.orders.put({"exit": True})\n',
        new="",
        tests=(_DEATH,),
    ),
    Mutation(
        name="slurm-lease-holder-said-ray",
        contract="a sweep waiting for a device a SLURM node's host holds is told it is a SLURM sweep's",
        path="optuna_saturn/pools/slurm.py",
        old='        "pool": "SLURM",',
        new="",
        tests=(f"{_TESTS}::test_a_slurm_nodes_host_leases_its_devices_shared_with_its_sweeps_other_nodes_only",),
    ),
    Mutation(
        name="slurm-nodes-of-one-sweep-do-not-share-leases",
        contract="one sweep's hosts of two nodes on one machine share its leases (else the second waits for ever)",
        path="optuna_saturn/pools/slurm.py",
        old="host_config=dict(common_config)",
        new="host_config=host_config(study)",  # (a sweep id of its own for each node's host)
        tests=(_SPREAD,),
    ),
    Mutation(
        name="slurm-release-keeps-the-node-in-the-job",
        contract="a node a deadline gives back leaves the SLURM job: sinfo shows it IDLE before the sweep ends",
        path="optuna_saturn/pools/slurm.py",
        old="                shrink(self.allocation.job_id, keep)\n",
        new="                pass\n",
        tests=(_RELEASE,),
    ),
    Mutation(
        name="slurm-release-offers-nothing",
        contract="the SLURM pool takes the nodes a deadline's release offers (it gave none back before)",
        path="optuna_saturn/pools/slurm.py",
        old="        for name, members in whole_nodes(self.devices, devices & self.ready(), gone).items():",
        new="        for name, members in whole_nodes(self.devices, set(), gone).items():",
        tests=(_RELEASE,),
    ),
    Mutation(
        name="slurm-shrunk-job-environment-stale",
        contract="after a shrink, the script in the allocation sees the job as it is (SLURM's resize script applied)",
        path="optuna_saturn/pools/slurm_job.py",
        old='            apply_resize_script(script.read_text(encoding="utf-8"), env)\n',
        new="            pass\n",
        tests=(f"{_TESTS}::test_slurms_resize_script_is_applied_as_a_shell_would", _RELEASE),
    ),
    Mutation(
        name="slurm-pool-never-asks-for-nodes",
        contract="outside an allocation, SlurmPool(nodes=...) asks SLURM for its nodes (it refused before)",
        path="optuna_saturn/pools/slurm_kind.py",
        old="        if inside or self._request is None:\n",
        new="        if True:\n",
        tests=(_OUTSIDE,),
    ),
    Mutation(
        name="slurm-pool-job-outlives-the-sweep",
        contract="the job the pool asked SLURM for ends when the sweep ends, not when the executor's process does",
        path="optuna_saturn/pools/slurm_kind.py",
        old="on_close=None if request is None else request.end,",
        new="on_close=None,",
        tests=(_OUTSIDE,),
    ),
    Mutation(
        name="slurm-refusal-not-in-slurms-words",
        contract="a job SLURM refuses (a partition it does not know) is an error that passes SLURM's own message on",
        path="optuna_saturn/pools/slurm_request.py",
        old='said = "\\n".join(self._said[-6:]) or f"salloc exited',
        new='said = "" or f"salloc exited',
        tests=(_PARTITION,),
    ),
    Mutation(
        name="slurm-job-not-started-left-queued",
        contract="a job given up on while SLURM has not started it (a timeout, an error, a Ctrl-C) is cancelled",
        path="optuna_saturn/pools/slurm_request.py",
        old="        except BaseException:\n            self.end()\n            raise\n",
        new="        except BaseException:\n            raise\n",
        tests=(_NO_START, f"{_TESTS}::test_a_ctrl_c_while_slurm_queues_the_pools_job_cancels_it"),
    ),
    Mutation(
        name="cli-pool-options-dropped",
        contract="optuna-saturn run --runner slurm --pool-option nodes=2 ... makes the pool with those options",
        path="optuna_saturn/cli/running.py",
        old="**pool_arguments(runner, ray_address, pool_option or ()),",
        new="**pool_arguments(runner, ray_address, ()),",
        tests=(f"{_TESTS}::test_the_command_line_asks_slurm_for_nodes_and_says_slurms_refusal_without_a_traceback",),
    ),
    Mutation(
        name="slurm-job-outlives-a-killed-executor",
        contract="a job the pool asked for ends within seconds of its executor's process being killed (kill -9)",
        path="optuna_saturn/pools/slurm_request.py",
        old='    "        break\\n"\n',
        new='    "        pass\\n"\n',
        tests=(f"{_TESTS}::test_a_job_the_pool_asked_for_ends_when_the_executors_process_is_killed",),
    ),
]
