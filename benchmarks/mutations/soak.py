"""Mutations of the fixes the soak (``benchmarks/soak.py``) led to: a full disk under ``log_dir`` ends no process of
the pool and no trial."""

from mutations import Mutation

_FULL_DISK = "tests/test_soak.py::test_a_full_disk_under_log_dir_ends_no_worker_and_no_trial"

MUTATIONS: list[Mutation] = [
    Mutation(
        name="pool-host-dies-telling-of-a-worker-on-a-full-disk",
        contract="the pool host's own log line about a worker's exit, refused by a full disk, does not end the host",
        path="optuna_saturn/pools/warm_host.py",
        old='            say(f"optuna-saturn: the worker of device {index} (pid {pid}) exited with code {code}.")',
        new='            print(f"optuna-saturn: the worker of device {index} (pid {pid}) exited with code {code}.", '
        "flush=True)",
        tests=(_FULL_DISK,),
    ),
    Mutation(
        name="worker-dies-on-its-job-header-on-a-full-disk",
        contract="a worker's own line before each job, refused by a full disk, ends neither the worker nor the trial",
        path="optuna_saturn/worker/warm.py",
        old="""            say(
                f"optuna-saturn: worker {worker} (pid {os.getpid()}) runs {job['name']} as rank {job['rank']} "
                f"of {job['world_size']}"
            )""",
        new="""            print(
                f"optuna-saturn: worker {worker} (pid {os.getpid()}) runs {job['name']} as rank {job['rank']} "
                f"of {job['world_size']}",
                flush=True,
            )""",
        tests=(_FULL_DISK,),
    ),
    Mutation(
        name="log-open-refused-not-discarded",
        contract="a log the disk refuses to open is discarded: the worker or job it is for runs all the same",
        path="optuna_saturn/worker/log_lines.py",
        old="    except OSError:\n        return os.open(os.devnull, os.O_WRONLY)",
        new="    except OSError:\n        raise",
        tests=("tests/test_soak.py::test_a_log_the_disk_refuses_to_open_is_discarded",),
    ),
]
