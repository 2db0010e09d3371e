"""The GPT-2 sweep of ``gpt2_sweep.py``, written with Lightning: a ``LightningModule`` and the usual
``Trainer.fit``, with one change: ``trial.lightning_trainer(...)`` where the script would say
``lightning.Trainer(...)``. The same model, text and search space; AdamW with a cosine schedule, gradient clipping
through the Trainer, and ``self.log("val_loss", ...)`` reported to the study (the median pruner stops every rank).

Run:  python examples/lightning_sweep.py       (8 trials, SQLite storage, every core as a CPU device)
Then: optuna-dashboard sqlite:///saturn-lightning.sqlite3
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

import lightning as L
import torch
from gpt2_sweep import EVAL_EVERY, TRAIN_STEPS, main, search_space, tiny_gpt2, train_and_validation

LOG_DIR = "saturn-lightning-runs"  # each trial logs under <this>/<study>-trial-<number>


class LanguageModel(L.LightningModule):
    def __init__(self, lr: float, n_embd: int, n_layer: int, seed: int) -> None:
        super().__init__()
        self.lr = lr
        self.model = tiny_gpt2(n_embd, n_layer, seed=seed)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        (ids,) = batch
        loss = self.model(input_ids=ids, labels=ids).loss
        self.log("train_loss", loss, sync_dist=True)
        return loss

    def validation_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
        (ids,) = batch
        self.log("val_loss", self.model(input_ids=ids, labels=ids).loss, sync_dist=True)

    def configure_optimizers(self) -> dict:
        optimizer = torch.optim.AdamW(self.parameters(), lr=self.lr, weight_decay=0.01)
        schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=TRAIN_STEPS)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


def objective(trial) -> float:
    lr, n_embd, n_layer, batch_size = search_space(trial)
    train, val = train_and_validation()
    module = LanguageModel(lr, n_embd, n_layer, seed=trial.number)
    train_loader = torch.utils.data.DataLoader(train, batch_size=batch_size, shuffle=True, drop_last=True)
    val_loader = torch.utils.data.DataLoader(val, batch_size=32)
    trainer = trial.lightning_trainer(  # the one change: the sweep's strategy, step counting, report and pruning
        max_steps=TRAIN_STEPS,
        val_check_interval=EVAL_EVERY,
        check_val_every_n_epoch=None,
        gradient_clip_val=1.0,
        num_sanity_val_steps=0,
        default_root_dir=LOG_DIR,
        metric="val_loss",
    )
    trainer.fit(module, train_loader, val_loader)
    return trainer.callback_metrics["val_loss"].item()


if __name__ == "__main__":
    main(objective, description=__doc__, storage="sqlite:///saturn-lightning.sqlite3", study_name="gpt2-lightning")
