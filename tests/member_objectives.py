"""Objectives that use every member of ``optuna.Trial``, and objectives that end themselves
(``tests/test_trial_members.py``)."""

from __future__ import annotations

import sys
import time

import torch
from objectives import Blocks, regression_data


def every_member(trial) -> float:
    """Calls each public member of optuna.Trial (on every rank, and reads on rank 0 alone too), trains for real,
    and records what it saw (as a real run: the describing and profiling runs record nothing)."""
    lr = trial.suggest_float("lr", 1e-3, 1e-1, log=True)
    width = trial.suggest_int("width", 8, 16, step=8)
    act = trial.suggest_categorical("act", ["tanh", "relu"])
    u = trial.suggest_uniform("u", 0.0, 1.0)
    lu = trial.suggest_loguniform("lu", 1e-3, 1.0)
    du = trial.suggest_discrete_uniform("du", 0.0, 1.0, 0.25)
    trial.set_user_attr("mine", {"width": width})
    trial.set_constraint("c0", u - 0.5)
    model = Blocks(width=width)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    loader = torch.utils.data.DataLoader(regression_data(64), batch_size=16)
    model, optimizer, loader = trial.prepare(model, optimizer, loader)
    batches = iter(loader)
    loss = torch.zeros(())
    for _ in trial.steps(4):
        x, y = next(batches)
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x.to(trial.device)), y.to(trial.device))
        trial.backward(loss)
        optimizer.step()
    if trial.is_real_run and trial.is_main_process:  # reads on rank 0 alone: no collective behind them
        seen = {
            "number": trial.number,
            "params": trial.params,
            "distributions": {k: repr(v) for k, v in trial.distributions.items()},
            "user_attrs": sorted(trial.user_attrs),
            "mine": trial.user_attrs["mine"],
            "constraints": trial.constraints,
            "relative_params": trial.relative_params,
            "datetime_start": trial.datetime_start.isoformat(),
            "study_name": trial.study.study_name,
            "direction": trial.study.direction.name,
            "study_user_attrs": trial.study.user_attrs,
            "act": act,
            "du": du,
            "lu": lu,
        }
        try:
            trial.study.trials  # noqa: B018
        except AttributeError as exc:
            seen["study_trials_error"] = str(exc)
        trial.set_user_attr("seen", seen)
    return trial.reduce_mean(loss.detach())


def ends_itself(trial) -> float:
    """``how`` 0: returns; 1: raises KeyboardInterrupt; 2: calls sys.exit(3), as a script's code might."""
    how = trial.suggest_int("how", 0, 2)
    for _ in trial.steps(2):
        time.sleep(0.01)
    if how == 1:
        raise KeyboardInterrupt
    if how == 2:
        sys.exit(3)
    return 0.0
