"""Objectives written the Hugging Face way: a ``transformers.Trainer``, and an Accelerate script. Each is the code
a user writes for one process, plus the one optuna-saturn call (``trial.prepare_trainer`` / ``trial.accelerator``).
"""

from __future__ import annotations

import os
import tempfile

import torch
from objectives import strategy_facts

VOCAB, LENGTH = 96, 16


class Tokens(torch.utils.data.Dataset):
    """Fixed random token sequences (a language-model batch: labels are the inputs)."""

    def __init__(self, rows: int, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, VOCAB, (rows, LENGTH), generator=generator)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict:
        return {"input_ids": self.ids[index], "labels": self.ids[index]}


def precision() -> str:
    """The mixed precision a test asks the objectives for: "bf16", "fp16", or "no"."""
    return os.environ.get("SATURN_TEST_PRECISION", "no")


def compute_dtypes(model: torch.nn.Module) -> set[str]:
    """Filled with the dtype of what the model's first block computes, at every forward: under autocast to
    bfloat16, "torch.bfloat16" (its outputs may still come back as float32)."""
    seen: set[str] = set()
    block = model.transformer.h[0].mlp.c_fc
    block.register_forward_hook(lambda module, args, output: seen.add(str(output.dtype)))
    return seen


def tiny_gpt2():
    """A GPT-2 of two layers from a config; ``SATURN_TEST_DROPOUT`` sets its dropout (none by default)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    dropout = float(os.environ.get("SATURN_TEST_DROPOUT", "0"))
    config = GPT2Config(
        vocab_size=VOCAB,
        n_positions=LENGTH,
        n_embd=32,
        n_layer=2,
        n_head=2,
        resid_pdrop=dropout,
        embd_pdrop=dropout,
        attn_pdrop=dropout,
        bos_token_id=0,
        eos_token_id=0,
    )
    torch.manual_seed(int(os.environ.get("SATURN_TEST_SEED", "0")))
    return GPT2LMHeadModel(config)


def trainer_gpt2(trial) -> float:
    """GPT-2 through ``Trainer``: AdamW, linear warm-up and decay, clipping, shuffled data, evaluation every 3
    steps, the loss logged every step."""
    from transformers import Trainer, TrainingArguments

    learning_rate = trial.suggest_float("learning_rate", 1e-4, 1e-2, log=True)
    output = os.environ.get("SATURN_TEST_OUTPUT") or tempfile.mkdtemp()
    args = TrainingArguments(
        output_dir=output,
        per_device_train_batch_size=8,
        per_device_eval_batch_size=8,
        gradient_accumulation_steps=int(os.environ.get("SATURN_TEST_ACCUMULATION", "1")),
        num_train_epochs=2,
        learning_rate=learning_rate,
        warmup_steps=2,
        lr_scheduler_type="linear",
        max_grad_norm=0.5,
        weight_decay=0.01,
        logging_steps=1,
        eval_strategy="steps",
        eval_steps=3,
        save_strategy="no",
        report_to=[],
        seed=int(os.environ.get("SATURN_TEST_SEED", "0")),
        use_cpu=trial.device.type == "cpu",
        disable_tqdm=True,
        bf16=precision() == "bf16",
        fp16=precision() == "fp16",
    )
    model = tiny_gpt2()
    dtypes = compute_dtypes(model)
    trainer = trial.prepare_trainer(
        Trainer(model=model, args=args, train_dataset=Tokens(48, seed=1), eval_dataset=Tokens(20, seed=2))
    )
    trainer.train()
    value = trainer.evaluate()["eval_loss"]
    history = trainer.state.log_history
    trial.set_user_attr("curve", [h["loss"] for h in history if "loss" in h])
    trial.set_user_attr("grad_norms", [h["grad_norm"] for h in history if "grad_norm" in h])
    trial.set_user_attr("eval_losses", [h["eval_loss"] for h in history if "eval_loss" in h])
    trial.set_user_attr("facts", strategy_facts(trainer.model_wrapped, trainer.optimizer.optimizer))
    trial.set_user_attr("output_dir", trainer.args.output_dir)
    trial.set_user_attr("compute_dtypes", sorted(dtypes))
    if os.environ.get("SATURN_TEST_SAVE"):
        trainer.save_model()
    return value


def accelerate_gpt2(trial) -> float:
    """GPT-2 in an Accelerate script: prepare, accumulate, backward, clip, schedule, gather for the evaluation."""
    learning_rate = trial.suggest_float("learning_rate", 1e-4, 1e-2, log=True)
    accelerator = trial.accelerator(mixed_precision=precision())
    model = tiny_gpt2()
    dtypes = compute_dtypes(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=0.01)
    generator = torch.Generator().manual_seed(3)
    loader = torch.utils.data.DataLoader(Tokens(48, seed=1), batch_size=8, shuffle=True, generator=generator)
    evaluation = torch.utils.data.DataLoader(Tokens(20, seed=2), batch_size=8)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1.0 + step))
    model, optimizer, loader, evaluation, scheduler = accelerator.prepare(
        model, optimizer, loader, evaluation, scheduler
    )
    curve, norms = [], []
    for epoch in range(2):
        model.train()
        for batch in loader:
            with accelerator.accumulate(model):
                loss = model(**batch).loss
                accelerator.backward(loss)
                norms.append(float(accelerator.clip_grad_norm_(model.parameters(), 0.5)))
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            curve.append(float(accelerator.reduce(loss.detach(), reduction="mean")))
        model.eval()
        losses = []
        with torch.no_grad():
            for batch in evaluation:
                loss = model(**batch).loss
                losses.append(accelerator.gather_for_metrics(loss.repeat(len(batch["input_ids"]))))
        value = float(torch.cat(losses).mean())
        trial.report(value, epoch)
    trial.set_user_attr("curve", curve)
    trial.set_user_attr("grad_norms", norms)
    trial.set_user_attr("facts", strategy_facts(model, optimizer.optimizer))
    trial.set_user_attr("accelerate_processes", accelerator.num_processes)
    trial.set_user_attr("compute_dtypes", sorted(dtypes))
    return value


def plain_accelerator(trial) -> float:
    """An Accelerate script left as it was, with Accelerate's own ``Accelerator()``."""
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    model = tiny_gpt2()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = torch.utils.data.DataLoader(Tokens(16, seed=1), batch_size=8)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for batch in loader:
        loss = model(**batch).loss
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    return float(loss)
