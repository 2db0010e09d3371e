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
from gpt2_sweep import EVAL_EVERY, SEQ_LEN, TRAIN_STEPS, VOCAB_SIZE, blocks, main, token_ids

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
    import transformers
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    transformers.logging.set_verbosity_error()
    lr = trial.suggest_float("lr", 1e-4, 1e-2, log=True)
    n_embd = trial.suggest_categorical("n_embd", [32, 64, 96])
    n_layer = trial.suggest_int("n_layer", 1, 3)
    batch_size = trial.suggest_categorical("batch_size", [8, 16, 32])

    ids = token_ids()
    split = int(len(ids) * 0.9)
    torch.manual_seed(trial.number)
    config = GPT2Config(
        vocab_size=VOCAB_SIZE, n_positions=SEQ_LEN, n_embd=n_embd, n_layer=n_layer, n_head=4,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
    )
    args = TrainingArguments(
        output_dir=OUTPUT_DIR, max_steps=TRAIN_STEPS, per_device_train_batch_size=batch_size,
        per_device_eval_batch_size=32, learning_rate=lr, weight_decay=0.01, lr_scheduler_type="cosine",
        warmup_steps=10, max_grad_norm=1.0, eval_strategy="steps", eval_steps=EVAL_EVERY, logging_steps=EVAL_EVERY,
        save_strategy="no", report_to=[], seed=trial.number, dataloader_drop_last=True, disable_tqdm=True,
        use_cpu=trial.device.type == "cpu",
    )
    trainer = trial.prepare_trainer(Trainer(
        model=GPT2LMHeadModel(config), args=args,
        train_dataset=LanguageModelRows(blocks(ids[:split])), eval_dataset=LanguageModelRows(blocks(ids[split:])),
    ))  # the one added line: the sweep's strategy, step counting, report and pruning on eval_loss
    trainer.train()
    return trainer.evaluate()["eval_loss"]


if __name__ == "__main__":
    main(objective, description=__doc__, storage="sqlite:///saturn-hf-trainer.sqlite3", study_name="gpt2-trainer")
