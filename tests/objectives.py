"""Objectives that tests launch in real worker processes (importable by the workers through sys.path)."""

from __future__ import annotations

import gc
import os
import sys
import time

import optuna
import torch
import torch.distributed as dist


def regression_data(n: int = 256, seed: int = 0) -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    w = torch.arange(1.0, 9.0).unsqueeze(1)
    return torch.utils.data.TensorDataset(x, x @ w / 8)


def train_linear(trial) -> float:
    """Trains a linear model under the trial's strategy and records what the tests check."""
    lr = trial.suggest_float("lr", 0.05, 0.2)
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    loader = torch.utils.data.DataLoader(regression_data(), batch_size=32, shuffle=True)
    model, optimizer, loader = trial.prepare(model, optimizer, loader)
    losses = []
    for epoch in trial.steps(15):
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x.to(trial.device)), y.to(trial.device))
            optimizer.zero_grad()
            trial.backward(loss)
            optimizer.step()
        losses.append(trial.reduce_mean(loss))
        trial.report(losses[-1], epoch)
        time.sleep(float(os.environ.get("SATURN_TEST_EPOCH_SLEEP", "0")))  # a longer trial, where a test needs one
    flat = torch.cat([p.detach().reshape(-1) for p in trial.unwrap(model).parameters()])
    gathered = [None] * trial.world_size
    pid_list = [None] * trial.world_size
    if trial.world_size > 1:
        dist.all_gather_object(gathered, flat)
        dist.all_gather_object(pid_list, os.getpid())
    else:
        gathered, pid_list = [flat], [os.getpid()]
    trial.set_user_attr("losses", losses)
    trial.set_user_attr("world_size", trial.world_size)
    trial.set_user_attr("pids", pid_list)
    trial.set_user_attr("batches_per_epoch", len(loader))
    trial.set_user_attr("max_param_diff_across_ranks", max(float((g - gathered[0]).abs().max()) for g in gathered))
    return losses[-1]


def quadratic(trial) -> float:
    """Cheap and deterministic: lets tests compare against a plain Optuna run."""
    x = trial.suggest_float("x", -10, 10)
    y = trial.suggest_int("y", -5, 5)
    kind = trial.suggest_categorical("kind", ["a", "b", "c"])
    return (x - 2) ** 2 + (y + 1) ** 2 + {"a": 0.0, "b": 1.0, "c": 2.0}[kind]


def curve(trial) -> float:
    """Intermediate values follow a curve offset by ``offset``; a large offset is a bad trial to prune."""
    offset = trial.suggest_float("offset", 0.0, 100.0)
    value = 0.0
    for step in trial.steps(10):
        value = offset + 10.0 / (step + 1)
        trial.report(value, step)
        if trial.should_prune():
            raise optuna.TrialPruned()
        time.sleep(0.05)
    return value


def maybe_raise(trial) -> float:
    """Raises for ``fail == 1`` on rank 0, for ``fail == 2`` on rank 1 only (a peer crash)."""
    fail = trial.suggest_int("fail", 0, 2)
    if fail == 1 and trial.rank == 0:
        raise ValueError("deliberate failure on rank 0")
    if fail == 2 and trial.rank == 1:
        raise RuntimeError("deliberate failure on rank 1")
    trial.barrier()
    return float(fail)


def sleepy(trial) -> float:
    """Runs long enough to be interrupted (60 s; ``SATURN_TEST_SLEEPY_STEPS`` of 0.1 s each)."""
    trial.suggest_float("x", 0, 1)
    for step in trial.steps(int(os.environ.get("SATURN_TEST_SLEEPY_STEPS", "600"))):
        time.sleep(0.1)
        if step % 10 == 9:
            trial.report(float(step), step)
    return 0.0


def slow_to_return(trial) -> float:
    """Reports steps 0 to 2, then takes ``SATURN_TEST_SLEEP_BEFORE_RETURN`` seconds (default 1) to return 0.5: a
    test can take the storage away between its last report and its result."""
    trial.suggest_float("x", 0, 1)
    for step in trial.steps(3):
        trial.report(float(step), step)
    time.sleep(float(os.environ.get("SATURN_TEST_SLEEP_BEFORE_RETURN", "1")))
    return 0.5


def segfaults(trial) -> float:
    """Its rank dies of a segmentation fault after a step: trial 0 does (a retry is another trial), or every
    trial with ``SATURN_TEST_SEGFAULT_ALWAYS=1``."""
    trial.suggest_float("x", 0, 1)
    for step in trial.steps(5):
        trial.report(float(step), step)
        if step == 1 and (trial.number == 0 or os.environ.get("SATURN_TEST_SEGFAULT_ALWAYS")):
            import ctypes

            ctypes.string_at(0)  # a real segmentation fault, not a signal sent
        time.sleep(0.05)
    return 0.0


def two_values(trial) -> tuple[float, float]:
    """A multi-objective trial (``directions=["minimize", "maximize"]``)."""
    x = trial.suggest_float("x", 0, 1)
    for _ in trial.steps(3):
        time.sleep(0.01)
    return x**2, 1.0 - x


class Blocks(torch.nn.Module):
    """A small model with repeated blocks, as FSDP and activation checkpointing expect."""

    def __init__(self, width: int = 16, depth: int = 3) -> None:
        super().__init__()
        self.inp = torch.nn.Linear(8, width)
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.Tanh()) for _ in range(depth)
        )
        self.out = torch.nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for block in self.blocks:
            x = x + block(x)
        return self.out(x)


def strategy_facts(model, optimizer) -> dict:
    """What a test needs to see that a strategy is really applied."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    facts: dict = {"optimizer": type(getattr(optimizer, "optimizer", optimizer)).__name__}
    if isinstance(model, FSDPModule):  # after a forward pass the root module keeps its parameters gathered
        model.reshard()
    params = list(model.parameters())
    dtensors = [p for p in params if isinstance(p, DTensor)]
    if dtensors:
        facts["sharded_params"] = len(dtensors) == len(params)
        facts["local_fraction"] = sum(p.to_local().numel() for p in dtensors) / sum(p.numel() for p in dtensors)
        state = model._get_fsdp_state()
        facts["fsdp_offload"] = type(state._fsdp_param_group.offload_policy).__name__
    if hasattr(model, "zero_optimization_stage"):
        facts["zero_stage"] = model.zero_optimization_stage()
        facts["zero_offload_optimizer"] = bool(model.zero_offload_optimizer())
        facts["zero_offload_param"] = bool(model.zero_offload_param())
    return facts


def same_curve(trial) -> float:
    """Identical data, seed and global batch under any strategy: the loss curve must not depend on it."""
    return curve_of(trial, Blocks)


def curve_of(trial, build) -> float:
    """``same_curve`` for the model ``build()`` makes."""
    torch.manual_seed(0)
    model = build()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = torch.utils.data.DataLoader(regression_data(128), batch_size=16, shuffle=False)
    model, optimizer, loader = trial.prepare(model, optimizer, loader)
    losses, micro_rows = [], set()
    batches = iter(loader)
    for _step in trial.steps(8):
        x, y = next(batches)
        optimizer.zero_grad()
        parts = []
        for mx, my in trial.micro_batches((x, y)):
            micro_rows.add(len(mx))
            loss = torch.nn.functional.mse_loss(model(mx.to(trial.device)), my.to(trial.device))
            trial.backward(loss)
            parts.append(loss.detach())
        optimizer.step()
        losses.append(trial.reduce_mean(torch.stack(parts).mean()))  # the whole batch's loss
    trial.set_user_attr("losses", losses)
    facts = strategy_facts(model, optimizer)
    facts.update(
        gradient_accumulation=trial.gradient_accumulation,
        micro_batch_rows=sorted(micro_rows),
        threads=torch.get_num_threads(),
        processes=trial.world_size,
    )
    trial.set_user_attr("facts", facts)
    return losses[-1]


def _endless(loader):
    """The loader's batches, pass after pass."""
    while True:
        yield from loader


def _train_blocks(trial, steps: int, *, largest_micro_batch: int | None = None, width: int = 32) -> float:
    """Trains ``Blocks`` on a global batch of 32; a micro-batch over ``largest_micro_batch`` rows runs out of
    memory (as on a GPU), in profiling and in the real run alike."""
    lr = trial.suggest_float("lr", 0.01, 0.04, log=True)  # (SGD on these blocks diverges to NaN near 0.1)
    torch.manual_seed(0)
    model = Blocks(width=width)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    loader = torch.utils.data.DataLoader(regression_data(512), batch_size=32, shuffle=True, drop_last=True)
    model, optimizer, loader = trial.prepare(model, optimizer, loader)
    batches = _endless(loader)
    loss = torch.zeros(())
    for _step in trial.steps(steps):
        x, y = next(batches)
        optimizer.zero_grad()
        for mx, my in trial.micro_batches((x, y)):
            if largest_micro_batch is not None and len(mx) > largest_micro_batch:
                raise torch.OutOfMemoryError(f"simulated: a micro-batch of {len(mx)} rows does not fit")
            loss = torch.nn.functional.mse_loss(model(mx.to(trial.device)), my.to(trial.device))
            trial.backward(loss)
        optimizer.step()
    trial.set_user_attr("gradient_accumulation_seen", trial.gradient_accumulation)
    return trial.reduce_mean(loss)


def profiled(trial) -> float:
    """Only the learning rate varies: every trial shares one profile per (strategy, device count)."""
    return _train_blocks(trial, 40)


def needs_small_micro_batches(trial) -> float:
    """Fits only as micro-batches of 8 rows: 4 per step on one device, 2 on each of two."""
    return _train_blocks(trial, 20, largest_micro_batch=8)


def evaluates_after_training(trial) -> float:
    """A final evaluation after the loop (0.5 s), whose code assumes the whole loop ran: a profiling run's short
    loop leaves it no validation loss, so it fails there (after the timed steps)."""
    model = torch.nn.Linear(8, 1)
    loader = torch.utils.data.DataLoader(regression_data(64), batch_size=8)
    model, loader = trial.prepare(model, loader)
    validation_losses = []
    for step in trial.steps(30):
        time.sleep(0.01)
        if step % 10 == 9:
            validation_losses.append(1.0 / (step + 1))
    time.sleep(0.5)
    return min(validation_losses)


def single_does_not_fit(trial) -> float:
    """Runs out of memory on one device (as a model too big for one GPU would); fits when sharded over two."""
    if (
        trial.world_size == 1 and trial.strategy is not None
    ):  # (the description, before any strategy, allocates nothing)
        raise MemoryError("simulated: the model does not fit one device")
    return profiled(trial)


def two_widths(trial) -> float:
    """Trials of two model widths: two workloads, so two profile keys per option."""
    return _train_blocks(trial, 20, width=trial.suggest_categorical("width", [16, 32]))


# -- the code users write: optimizers, schedulers, clipping, samplers, streams (the user-code matrix) --------------

OPTIMIZERS = ("AdamW", "Adam", "SGD-momentum", "Adafactor")
EXTRAS = ("scheduler", "clipping")
DATA = ("custom-sampler", "iterable")
USER_CODE_CASES = [f"{o}/{e}/{d}" for o in OPTIMIZERS for e in EXTRAS for d in DATA]


class EvenRowsSampler(torch.utils.data.Sampler):
    """A user's own sampler: a shuffled training split (the even rows), drawn from the global torch generator."""

    def __init__(self, rows: int) -> None:
        self.rows = rows

    def __iter__(self):
        return iter((2 * torch.randperm(self.rows // 2)).tolist())

    def __len__(self) -> int:
        return self.rows // 2


class RegressionStream(torch.utils.data.IterableDataset):
    """An ``IterableDataset`` of 45 rows in a shuffled order (global generator): batches of 16, 16 and 13."""

    def __init__(self) -> None:
        self.data = regression_data(45, seed=3)

    def __iter__(self):
        for i in torch.randperm(len(self.data)).tolist():
            yield self.data[i]


def _optimizer(name: str, params):
    if name == "AdamW":
        return torch.optim.AdamW(params, lr=0.01, weight_decay=0.1)
    if name == "Adam":
        return torch.optim.Adam(params, lr=0.01)
    if name == "SGD-momentum":
        return torch.optim.SGD(params, lr=0.05, momentum=0.9, nesterov=True)
    from transformers.optimization import Adafactor  # an optimizer from outside torch

    return Adafactor(params, lr=0.01, relative_step=False, scale_parameter=False, warmup_init=False)


def _user_code_case(trial, case: str) -> dict:
    """One case: the loop a user writes for one process, run under the trial's strategy. Returns the loss curve
    (each step's whole-batch mean), the learning rates and gradient norms, or the error it raised."""
    optimizer_name, extra, data = case.split("/")
    torch.manual_seed(0)
    model = Blocks(width=16, depth=2)
    optimizer = _optimizer(optimizer_name, model.parameters())
    scheduler = None
    if extra == "scheduler" and optimizer_name in ("AdamW", "Adam"):  # made before prepare...
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1.0 + step))
    if data == "custom-sampler":
        loader = torch.utils.data.DataLoader(regression_data(90, seed=2), batch_size=16, sampler=EvenRowsSampler(90))
    else:
        loader = torch.utils.data.DataLoader(RegressionStream(), batch_size=16)
    try:
        model, optimizer, loader = trial.prepare(model, optimizer, loader)
    except ValueError as exc:  # refused, with the reason
        return {"error": f"{type(exc).__name__}: {exc}"}
    if extra == "scheduler" and scheduler is None:  # ...or after it
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    curve, lrs, norms = [], [], []
    try:
        for _epoch in range(2):
            for x, y in loader:
                optimizer.zero_grad()
                rank_loss = torch.zeros(())
                for mx, my in trial.micro_batches((x, y)):
                    loss = torch.nn.functional.mse_loss(model(mx.to(trial.device)), my.to(trial.device))
                    trial.backward(loss)
                    rank_loss += loss.detach().cpu() * len(mx) / len(x)
                if extra == "clipping":
                    norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.05)))
                optimizer.step()
                lrs.append(optimizer.param_groups[0]["lr"])
                if scheduler is not None:
                    scheduler.step()
                curve.append(trial.reduce_mean(rank_loss, weight=len(x)))
    except ValueError as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {"curve": curve, "lrs": lrs, "norms": norms}


def _saving_and_evaluating(trial) -> dict:
    """Train a little, save the model the way users do, and evaluate on 13 rows in batches of 4 (the last batch
    has one row: fewer than two ranks)."""
    torch.manual_seed(0)
    model = Blocks(width=16, depth=2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(regression_data(64), batch_size=16, shuffle=True)
    evaluation = torch.utils.data.DataLoader(regression_data(13, seed=5), batch_size=4)
    model, optimizer, loader, evaluation = trial.prepare(model, optimizer, loader, evaluation)
    for x, y in loader:
        optimizer.zero_grad()
        trial.backward(torch.nn.functional.mse_loss(model(x.to(trial.device)), y.to(trial.device)))
        optimizer.step()
    try:
        trial.unwrap(model).state_dict()
        unwrap = "ok"
    except ValueError as exc:
        unwrap = str(exc)
    state = trial.state_dict(model)
    saved = {k: v.detach().cpu().reshape(-1).tolist() for k, v in state.items()}
    per_row, total, rows = [], 0.0, 0
    with torch.no_grad():
        for x, y in evaluation:
            errors = (model(x.to(trial.device)) - y.to(trial.device)).pow(2).reshape(-1)
            per_row.append(trial.gather_for_metrics(errors))
            total, rows = total + float(errors.sum()), rows + len(x)
    return {
        "unwrap": unwrap,
        "saved": saved if trial.is_main_process else None,
        "gathered": torch.cat(per_row).tolist(),
        "weighted": trial.reduce_mean(total / rows, weight=rows),
    }


def user_code_matrix(trial) -> float:
    """Every case of the user-code matrix in one launch (a launch per strategy keeps the matrix fast)."""
    trial.suggest_float("x", 0, 1)
    results = {case: _user_code_case(trial, case) for case in USER_CODE_CASES}
    results["saving-and-evaluating"] = _saving_and_evaluating(trial)
    trial.set_user_attr("results", results)
    return 0.0


def epochs_with_evaluation(trial) -> float:
    """The loop shape users write: epochs, each a ``trial.steps(len(loader))`` loop, then an evaluation.
    6 epochs x 8 steps of 60 ms, and 0.3 s of evaluation after each epoch: about 4.7 s of loops and evaluation."""
    trial.suggest_float("lr", 0.01, 0.1)
    model = torch.nn.Linear(8, 1)
    loader = torch.utils.data.DataLoader(regression_data(64), batch_size=8, shuffle=True)
    evaluation = torch.utils.data.DataLoader(regression_data(30, seed=1), batch_size=10)
    model, loader, evaluation = trial.prepare(model, loader, evaluation)
    losses = []
    for epoch in range(6):
        batches = iter(loader)
        epoch_loss = 0.0
        for _ in trial.steps(len(loader)):
            x, y = next(batches)
            time.sleep(0.06)
            epoch_loss += float(torch.nn.functional.mse_loss(model(x), y))
        for _ in evaluation:  # 3 batches of 0.1 s
            time.sleep(0.1)
        losses.append(epoch_loss / len(loader))
        trial.report(losses[-1], epoch)
    return losses[-1]


def crashes_under_fsdp(trial) -> float:
    """Runs under every strategy but FSDP, where it crashes (as AdamW under FSDP did): a crashed profile must
    never reach the planner, and must not take the other strategies of its launch down with it."""
    if trial.strategy is not None and trial.strategy.name == "fsdp":
        raise RuntimeError("simulated crash under fsdp")
    return profiled(trial)


def leaves_a_mess(trial) -> float:
    """Records the process-wide state it finds, then changes it: the next trial on a reused worker must find
    it as a fresh process would (its dtype, environment, random generator, threads, process group)."""
    trial.suggest_float("x", 0, 1)
    trial.set_user_attr(
        "found",
        {
            "pid": os.getpid(),
            "dtype": str(torch.get_default_dtype()),
            "env": os.environ.get("SATURN_TEST_MESS"),
            "random": torch.rand(1).item(),
            "threads": torch.get_num_threads(),
            "grad": torch.is_grad_enabled(),
            "world": dist.get_world_size() if dist.is_initialized() else None,
            "cwd": os.getcwd(),
        },
    )
    torch.set_default_dtype(torch.float64)
    os.environ["SATURN_TEST_MESS"] = "left behind"
    torch.manual_seed(1234)
    torch.set_num_threads(3)
    torch.set_grad_enabled(False)
    os.chdir("/")
    if dist.is_initialized():
        dist.new_group(backend="gloo")  # a group of the trial's own: destroyed with its process group
    return 0.0


def oom_first(trial) -> float:
    """Trial 0 runs out of memory (its worker must be replaced); the others succeed and say where they ran."""
    x = trial.suggest_float("x", 0, 1)
    trial.set_user_attr("pid", os.getpid())
    if trial.number == 0:
        raise torch.OutOfMemoryError("simulated out of memory")
    return x


def oom_three_times(trial) -> float:
    """Trials 0-2 run out of memory at once (each replaces its worker within moments of its start)."""
    x = trial.suggest_float("x", 0, 1)
    if trial.number < 3:
        raise torch.OutOfMemoryError("simulated out of memory")
    return x


def sleeps(trial) -> float:
    """Takes ``seconds``: a long trial and short ones."""
    seconds = trial.suggest_float("seconds", 0.1, 10.0)
    for _ in trial.steps(10):
        time.sleep(seconds / 10)
    return seconds


def where_it_runs(trial) -> float:
    """Says which process its worker was forked from (the pool host: its command line, its network namespace),
    and what its garbage collector sees, after a parallel-looking torch op and, on several devices, a
    collective: it must not hang."""
    trial.suggest_float("x", 0, 1)
    host = os.getppid()
    with open(f"/proc/{host}/cmdline", "rb") as f:
        cmdline = f.read().split(b"\0")
    (torch.randn(1_000_000) * 2).exp().sum()
    total = torch.ones(1)
    if dist.is_initialized():
        dist.all_reduce(total)
    trial.set_user_attr(
        "host",
        {
            "cmdline": [part.decode() for part in cmdline if part],
            "net": os.readlink("/proc/self/ns/net"),
            "threads": torch.get_num_threads(),
            "gc_frozen": gc.get_freeze_count(),
            "gc_tracked": len(gc.get_objects()),
        },
    )
    return float(total)


#: Epochs of ``resumable``; it checkpoints every 2 epochs and reports every epoch.
RESUMABLE_EPOCHS = 6


def resumable(trial) -> float:
    """What a user writes to survive a dead sweep: AdamW with a warm-up/decay schedule, a shuffled loader,
    ``trial.restore`` before the loop and ``trial.checkpoint`` every 2 epochs (every ``SATURN_TEST_CHECKPOINT_EVERY``
    steps if set: mid-epoch too). With ``SATURN_TEST_HANG_AT=k`` its
    first run (not a resumed one) stops moving after it reports at step k, so a test can kill its sweep there;
    with ``SATURN_TEST_OOM_AT=k`` its first run on several ranks runs out of memory there. ``SATURN_TEST_EPOCHS``
    sets its length, ``SATURN_TEST_STEP_SLEEP`` adds seconds to each step (divided by the ranks with
    ``SATURN_TEST_SLEEP_SPLIT=1``: more devices then run it faster), and ``SATURN_TEST_PRUNE_AT=n:k`` prunes trial
    ``n`` at step ``k``."""
    lr = trial.suggest_float("lr", 0.01, 0.03)
    torch.manual_seed(0)
    model = Blocks(width=16, depth=2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    loader = torch.utils.data.DataLoader(regression_data(64), batch_size=16, shuffle=True)
    model, optimizer, loader = trial.prepare(model, optimizer, loader)
    per_epoch = len(loader)
    total = int(os.environ.get("SATURN_TEST_EPOCHS", RESUMABLE_EPOCHS)) * per_epoch
    sleep = float(os.environ.get("SATURN_TEST_STEP_SLEEP", "0"))
    sleep /= trial.world_size if os.environ.get("SATURN_TEST_SLEEP_SPLIT") else 1
    prune_trial, _, prune_at = os.environ.get("SATURN_TEST_PRUNE_AT", "-1:0").partition(":")
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=lr, total_steps=total)
    start = trial.restore(model, optimizer, scheduler)
    hang_at = int(os.environ.get("SATURN_TEST_HANG_AT", "0"))
    every = int(os.environ.get("SATURN_TEST_CHECKPOINT_EVERY", 2 * per_epoch))
    batches = iter(loader)  # (after the restore: a pass cut by a checkpoint goes on where it was)
    for step in trial.steps(total, start=start):
        try:
            x, y = next(batches)
        except StopIteration:  # the next epoch
            batches = iter(loader)
            x, y = next(batches)
        optimizer.zero_grad()
        for mx, my in trial.micro_batches((x.to(trial.device), y.to(trial.device))):
            trial.backward(torch.nn.functional.mse_loss(model(mx), my))
        optimizer.step()
        scheduler.step()
        time.sleep(sleep)
        if (step + 1) % per_epoch == 0:
            trial.report(_full_loss(trial, model), step + 1)
            if trial.number == int(prune_trial) and step + 1 == int(prune_at):
                raise optuna.TrialPruned()
        if (step + 1) % every == 0:
            trial.checkpoint(step + 1, model, optimizer, scheduler)
        if (step + 1) % per_epoch == 0:
            if start == 0 and step + 1 == hang_at:
                time.sleep(3600)
            if start == 0 and step + 1 == int(os.environ.get("SATURN_TEST_OOM_AT", "0")) and trial.world_size > 1:
                raise torch.OutOfMemoryError("out of memory (a test's: this option does not fit at this step)")
    trial.set_user_attr("started_at_step", start)
    return _full_loss(trial, model)


def _full_loss(trial, model) -> float:
    """The loss over all 64 rows, the same on every rank."""
    x, y = regression_data(64).tensors
    with torch.no_grad():
        return trial.reduce_mean(torch.nn.functional.mse_loss(model(x.to(trial.device)), y.to(trial.device)))


def counted_steps(trial) -> float:
    """Runs ``steps`` steps of 0.2 s on a small model, so the planner can tell a long trial from short ones; with
    ``sample_lr`` enqueued, it also samples a learning rate."""
    steps = trial.suggest_int("steps", 1, 50)
    sample_lr = trial.suggest_categorical("sample_lr", [False, True])
    lr = trial.suggest_float("lr", 0.01, 0.03) if sample_lr else 0.02
    torch.manual_seed(0)
    model = Blocks(width=8, depth=1)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    loader = torch.utils.data.DataLoader(regression_data(32), batch_size=32)
    model, optimizer, loader = trial.prepare(model, optimizer, loader)
    for _ in trial.steps(steps):
        x, y = next(iter(loader))
        optimizer.zero_grad()
        trial.backward(torch.nn.functional.mse_loss(model(x.to(trial.device)), y.to(trial.device)))
        optimizer.step()
        time.sleep(0.2)
    return float(steps)


def mixed_sizes(trial) -> float:
    """Trials of mixed sizes (``width``, ``depth``, ``batch``, ``steps``), which report their loss every 20 steps:
    small ones are best on one device each, ones of large batches on two."""
    width = trial.suggest_int("width", 16, 2048, log=True)
    depth = trial.suggest_int("depth", 1, 4)
    steps = trial.suggest_int("steps", 10, 5000)
    batch = trial.suggest_int("batch", 16, 8192, log=True)
    lr = trial.suggest_float("lr", 0.005, 0.05, log=True)
    torch.manual_seed(0)
    model = Blocks(width=width, depth=depth)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    loader = torch.utils.data.DataLoader(regression_data(4 * batch), batch_size=batch, shuffle=True, drop_last=True)
    model, optimizer, loader = trial.prepare(model, optimizer, loader)
    batches = _endless(loader)
    loss = torch.zeros(())
    for step in trial.steps(steps):
        x, y = next(batches)
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x.to(trial.device)), y.to(trial.device))
        trial.backward(loss)
        optimizer.step()
        if (step + 1) % 20 == 0:
            trial.report(trial.reduce_mean(loss), step + 1)
            if trial.should_prune():
                raise optuna.TrialPruned()
    return trial.reduce_mean(loss)


def misbehaves_before_its_loop(trial) -> float:
    """What a user's objective may do before its ``trial.steps()`` loop (``SATURN_TEST_MISBEHAVE``), in trial 0
    only: ``sys.exit``, ``KeyboardInterrupt``, ``os._exit``, ``hang``, ``thread`` (a non-daemon thread left
    running), ``fork`` (a child that returns from the fork too) or ``loader`` (``iter()`` of a DataLoader with two
    worker processes). Every trial writes where it ran to ``SATURN_TEST_PIDS`` (a folder): the executor's process
    must never be among them."""
    import threading

    lr = trial.suggest_float("lr", 1e-3, 1e-1, log=True)
    with open(os.path.join(os.environ["SATURN_TEST_PIDS"], f"{os.getpid()}-{trial.number}"), "w") as f:
        f.write("real" if getattr(trial, "is_real_run", True) else "described")
    how = os.environ.get("SATURN_TEST_MISBEHAVE", "") if trial.number == 0 else ""
    if how == "sys.exit":
        sys.exit(3)
    if how == "KeyboardInterrupt":
        raise KeyboardInterrupt
    if how == "os._exit":
        os._exit(7)
    if how == "hang":
        time.sleep(3600)
    if how == "thread":
        threading.Thread(target=time.sleep, args=(3600,), name="objective-thread").start()
    if how == "fork" and os.fork() == 0:
        time.sleep(0.1)  # (then returns from the objective too, as the classic mistake does)
    data = regression_data(64)
    loader = torch.utils.data.DataLoader(data, batch_size=16, num_workers=2 if how == "loader" else 0)
    next(iter(loader))  # (the docs' plain loop starts its loader before trial.steps())
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    model, optimizer, loader = trial.prepare(model, optimizer, loader)
    batches = _endless(loader)
    loss = torch.zeros(())
    for _ in trial.steps(4):
        x, y = next(batches)
        loss = torch.nn.functional.mse_loss(model(x), y)
        trial.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    return float(loss)


def reports(trial) -> tuple[float, float]:
    """Reports an intermediate value, as a single-objective objective would; returns two values."""
    x = trial.suggest_float("x", 0, 1)
    trial.report(x, 0)
    return x, 1 - x


def stops_the_study(trial) -> float:
    """``trial.study.stop()`` from trial 1: as in ``study.optimize``, no trial is asked after it."""
    x = trial.suggest_float("x", 0, 1)
    if trial.number == 1:
        trial.study.stop()
    time.sleep(0.2)
    return x


def slow_to_warm_up(trial) -> float:
    """Sleeps 30 s wherever it is not the run that counts (the pool host's warm-up, a description)."""
    if not trial.is_real_run:
        time.sleep(30)
    return trial.suggest_float("x", 0, 1)


def described_slowly_after_the_first(trial) -> float:
    """Trains ``Blocks``; described (in the describer's fork), every trial but the first takes 3 s more before its
    loop: a slow description, as a large model's first import makes one."""
    with open("/proc/self/comm", encoding="utf-8") as f:
        if f.read().startswith("saturn-describ") and trial.number > 0:
            time.sleep(3.0)
    return _train_blocks(trial, 40)
