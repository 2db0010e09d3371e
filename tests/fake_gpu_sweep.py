"""A real sweep on a fake 4-GPU node (``tests/fake_gpu``), for ``tests/test_fake_gpu.py``: every process of it
believes it drives CUDA GPUs and runs on the CPU. Run it inside a loopback-only network namespace, with
``tests/fake_gpu`` first on ``PYTHONPATH`` and ``SATURN_FAKE_GPUS`` set:

    python tests/fake_gpu_sweep.py MODE OUT.json

MODE:
- ``local``: the local pool, its host and workers;
- ``broken-one`` / ``broken-all``: the local pool, where the GPUs ``SATURN_FAKE_GPU_BROKEN`` names cannot create
  a context;
- ``hangs``: the context creation of the GPUs ``SATURN_FAKE_GPU_HANGS`` names hangs; the pool's start time-out is
  ``HANG_START_TIMEOUT``;
- ``leaks``: one GPU, three trials (``leaky``) that keep memory on it past their end;
- ``ray``: a one-node Ray cluster started here with four GPUs, where Ray leaves every actor the node's whole mask,
  as ``RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES`` makes it: only optuna-saturn's own binding puts an actor on
  its GPU.

Four one-GPU trials run, then four DDP trials of two GPUs. Each records, from inside every rank, the mask,
``LOCAL_RANK`` and current device it ran with; the JSON holds the trials, the fake GPUs' log, the error the sweep
ended with (None) and its seconds."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]

import optuna  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from optuna_saturn import SaturnExecutor  # noqa: E402

#: Trials of each phase: one-GPU trials, then two-GPU ones.
TRIALS_PER_PHASE = 4
#: The workers' start time-out in ``hangs``.
HANG_START_TIMEOUT = 15.0


def placement(trial) -> float:
    """Trains a little under its strategy (so a rank really computes on what it believes is ``cuda:0``), then
    records, from every rank, where it ran."""
    trial.suggest_float("lr", 0.01, 0.1)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    model, optimizer = trial.prepare(model, optimizer)
    for _step in trial.steps(3):
        x = torch.ones(8, 4, device=trial.device)
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        trial.backward(loss)
        optimizer.step()
    mine = {
        "pid": os.getpid(),
        "mask": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "local_rank": os.environ.get("LOCAL_RANK"),
        "current_device": torch.cuda.current_device(),
        "device": str(trial.device),
        "initialized": torch.cuda.is_initialized(),
        "ray_gpu": _ray_gpu(),
    }
    ranks = [None] * trial.world_size
    if trial.world_size > 1:
        dist.all_gather_object(ranks, mine)
    else:
        ranks = [mine]
    trial.set_user_attr("ranks", ranks)
    return float(loss)


#: What ``leaky`` keeps on its GPU per trial number: under the worker's threshold, then over it, then nothing.
HELD_MIB = [100, 300, 0]


def leaky(trial) -> float:
    """Keeps ``HELD_MIB[number]`` on its (fake) GPU past its end, as a module-level cache of GPU tensors would;
    records its worker's pid."""
    import fake_cuda

    trial.suggest_float("lr", 0.01, 0.1)
    fake_cuda.hold(HELD_MIB[trial.number] * 2**20)
    trial.set_user_attr("ranks", [{"pid": os.getpid(), "mask": os.environ.get("CUDA_VISIBLE_DEVICES")}])
    return 0.0


def _leaks(study: optuna.Study, options: dict) -> None:
    """One GPU, three trials one after another (``leaky``)."""
    executor = SaturnExecutor(devices=1, strategies=["single"], dashboard=False, **options)
    executor.optimize(study, leaky, n_trials=len(HELD_MIB))


def _ray_gpu() -> str | None:
    """The GPU Ray gave this process's actor, where it is one."""
    if "ray" not in sys.modules:
        return None
    import ray

    if not ray.is_initialized():
        return None
    ids = ray.get_runtime_context().get_accelerator_ids().get("GPU", [])
    return ",".join(str(i) for i in ids)


def main(mode: str, out: str) -> None:
    tmp = tempfile.mkdtemp(prefix="saturn-fake-gpu-")
    os.environ["SATURN_FAKE_GPU_LOG"] = log = os.path.join(tmp, "fake-gpu.jsonl")
    with contextlib.ExitStack() as stack:
        options: dict = {"log_dir": f"{tmp}/runs", "profile_store": f"{tmp}/profiles", "progress": "plain"}
        if mode == "ray":
            import ray

            os.environ["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"] = "1"
            ray.init(num_cpus=4, num_gpus=4, include_dashboard=False, log_to_driver=False)
            stack.callback(ray.shutdown)
            options["runner"] = "ray"
        if mode == "hangs":
            import optuna_saturn.pools.worker_starts as worker_starts

            worker_starts.WORKER_START_SECONDS = HANG_START_TIMEOUT  # (read when the pool starts)
        # four one-GPU trials, then four DDP trials of exactly two GPUs each (a strategy of the user's, so the
        # planner cannot choose one GPU for them), on the same study
        folder = os.path.join(tmp, "strategies")
        os.makedirs(folder)
        with open(os.path.join(folder, "ddp2.toml"), "w", encoding="utf-8") as f:
            f.write('name = "ddp2"\nlauncher = "torchrun"\nengine = "ddp"\nmin_devices = 2\nmax_devices = 2\n')
        study = optuna.create_study()
        for number in range(0 if mode == "leaks" else 2 * TRIALS_PER_PHASE):
            study.enqueue_trial({"lr": 0.01 + 0.005 * number})
        started = time.monotonic()
        error = None
        for strategy in () if mode == "leaks" else ("single", "ddp2"):
            executor = SaturnExecutor(
                devices=4, strategies=[strategy], strategy_folders=[folder], dashboard=False, **options
            )
            try:
                executor.optimize(study, placement, n_trials=TRIALS_PER_PHASE)
            except Exception as exc:  # (what the test checks: the sweep ended with the reason)
                import traceback

                error = f"{type(exc).__name__}: {exc}"
                traceback.print_exc()
                break
        if mode == "leaks":
            _leaks(study, options)
        seconds = time.monotonic() - started
        trials = [
            {
                "number": t.number,
                "state": t.state.name,
                "devices": t.system_attrs.get("saturn:devices"),
                "strategy": t.system_attrs.get("saturn:strategy"),
                "reason": t.system_attrs.get("saturn:fail_reason"),
                "ranks": t.user_attrs.get("ranks"),
            }
            for t in study.trials
        ]
    from fake_cuda import read_log

    with open(out, "w", encoding="utf-8") as f:
        logs = read_log(log) if os.path.exists(log) else []
        hosts = "".join(p.read_text(errors="replace") for p in Path(tmp, "runs").rglob("pool-host.log"))
        json.dump({"trials": trials, "log": logs, "mode": mode, "error": error, "seconds": seconds, "hosts": hosts}, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
