"""The GPT-2 sweep of ``gpt2_sweep.py``, written with ``transformers.Trainer``: the usual Trainer code plus one
call, ``trial.prepare_trainer(trainer)``. The same model, text and search space; Trainer's own AdamW, cosine
schedule with warm-up, gradient clipping and evaluation loop.

Run:  python examples/hf_trainer_sweep.py       (8 trials, SQLite storage, every core as a CPU device)
Then: optuna-dashboard sqlite:///saturn-hf-trainer.sqlite3
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

import torch
from gpt2_sweep import EVAL_EVERY, TRAIN_STEPS, main, search_space, tiny_gpt2, train_and_validation

OUTPUT_DIR = "saturn-hf-trainer-runs"  # each trial writes under <this>/trial-<number>


class LanguageModelRows(torch.utils.data.Dataset):
    """Rows of token ids, as Trainer's models take them: the labels are the inputs (the model shifts them)."""

    def __init__(self, rows: torch.utils.data.TensorDataset) -> None:
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict:
        (ids,) = self.rows[index]
        return {"input_ids": ids, "labels": ids}


def objective(trial) -> float:
    from transformers import Trainer, TrainingArguments

    lr, n_embd, n_layer, batch_size = search_space(trial)
    train, val = train_and_validation()
    model = tiny_gpt2(n_embd, n_layer, seed=trial.number)
    args = TrainingArguments(
        output_dir=OUTPUT_DIR,
        max_steps=TRAIN_STEPS,
        per_device_train_batch_size=batch_size,
        per_device_eval_batch_size=32,
        learning_rate=lr,
        weight_decay=0.01,
        lr_scheduler_type="cosine",
        warmup_steps=10,
        max_grad_norm=1.0,
        eval_strategy="steps",
        eval_steps=EVAL_EVERY,
        logging_steps=EVAL_EVERY,
        save_strategy="no",
        report_to=[],
        seed=trial.number,
        dataloader_drop_last=True,
        disable_tqdm=True,
        use_cpu=trial.device.type == "cpu",
    )
    trainer = trial.prepare_trainer(
        Trainer(model=model, args=args, train_dataset=LanguageModelRows(train), eval_dataset=LanguageModelRows(val))
    )  # the one added line: the sweep's strategy, step counting, report and pruning on eval_loss
    trainer.train()
    return trainer.evaluate()["eval_loss"]


if __name__ == "__main__":
    main(objective, description=__doc__, storage="sqlite:///saturn-hf-trainer.sqlite3", study_name="gpt2-trainer")
