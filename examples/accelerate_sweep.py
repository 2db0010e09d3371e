"""The GPT-2 sweep of ``gpt2_sweep.py``, written as an Accelerate script: the usual ``Accelerator`` code, with
``trial.accelerator()`` where the script would say ``Accelerator()``. ``prepare``, ``backward``,
``clip_grad_norm_`` and ``gather_for_metrics`` then apply the sweep's strategy, and the prepared training
DataLoader's batches are the trial's steps.

Run:  python examples/accelerate_sweep.py       (8 trials, SQLite storage, every core as a CPU device)
Then: optuna-dashboard sqlite:///saturn-accelerate.sqlite3
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

import optuna
import torch
from gpt2_sweep import EVAL_EVERY, TRAIN_STEPS, main, search_space, tiny_gpt2, train_and_validation


def objective(trial) -> float:
    from transformers import get_cosine_schedule_with_warmup

    lr, n_embd, n_layer, batch_size = search_space(trial)
    accelerator = trial.accelerator()  # instead of Accelerator()
    train, val = train_and_validation()
    model = tiny_gpt2(n_embd, n_layer, seed=trial.number)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    scheduler = get_cosine_schedule_with_warmup(optimizer, num_warmup_steps=10, num_training_steps=TRAIN_STEPS)
    # TRAIN_STEPS batches drawn at random: one pass of this loader is the whole training run
    sampler = torch.utils.data.RandomSampler(train, num_samples=TRAIN_STEPS * batch_size)
    train_loader = torch.utils.data.DataLoader(train, batch_size=batch_size, sampler=sampler)
    val_loader = torch.utils.data.DataLoader(val, batch_size=32)
    model, optimizer, train_loader, val_loader, scheduler = accelerator.prepare(
        model, optimizer, train_loader, val_loader, scheduler
    )

    def validation_loss() -> float:
        model.eval()
        losses = []
        with torch.no_grad():
            for (x,) in val_loader:
                loss = model(input_ids=x, labels=x).loss
                losses.append(accelerator.gather_for_metrics(loss.repeat(len(x))))
        model.train()
        return float(torch.cat(losses).mean())

    model.train()
    for step, (x,) in enumerate(train_loader):
        loss = model(input_ids=x, labels=x).loss
        accelerator.backward(loss)
        accelerator.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        if (step + 1) % EVAL_EVERY == 0:
            value = validation_loss()
            trial.report(value, step + 1)
            if trial.should_prune():
                raise optuna.TrialPruned()
    return validation_loss()


if __name__ == "__main__":
    main(objective, description=__doc__, storage="sqlite:///saturn-accelerate.sqlite3", study_name="gpt2-accelerate")
