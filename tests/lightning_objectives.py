"""An objective written with Lightning: the code a user writes for one process (a ``LightningModule`` with AdamW,
a per-step LR schedule, gradient clipping through the Trainer, ``self.log`` with ``sync_dist``), plus the one
optuna-saturn call: ``trial.lightning_trainer(...)`` where the script says ``lightning.Trainer(...)``."""

from __future__ import annotations

import ast
import os

import lightning as L
import torch
from hf_objectives import Tokens, compute_dtypes, precision, tiny_gpt2
from objectives import strategy_facts


class TinyGPT2(L.LightningModule):
    def __init__(self, learning_rate: float) -> None:
        super().__init__()
        self.learning_rate = learning_rate
        self.model = tiny_gpt2()
        self.dtypes = compute_dtypes(self.model)
        self.curve: list[float] = []

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        loss = self.model(**batch).loss
        self.log("train_loss", loss, sync_dist=True)
        self.curve.append(float(self.trainer.strategy.reduce(loss.detach(), reduce_op="mean")))
        return loss

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self.log("val_loss", self.model(**batch).loss, sync_dist=True)

    def configure_optimizers(self) -> dict:
        if os.environ.get("SATURN_TEST_OPTIMIZER") == "sgd":  # (clipping shows: Adam normalises the scale away)
            optimizer = torch.optim.SGD(self.parameters(), lr=30 * self.learning_rate)
        else:
            optimizer = torch.optim.AdamW(self.parameters(), lr=self.learning_rate, weight_decay=0.01)
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1.0 + step))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


def lightning_gpt2(trial) -> float:
    """GPT-2 in a LightningModule: 2 epochs of 6 batches of 8 rows, validation every 3 steps on 20 rows."""
    module = TinyGPT2(trial.suggest_float("learning_rate", 1e-4, 1e-2, log=True))
    train = torch.utils.data.DataLoader(
        Tokens(48, seed=1), batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(3)
    )
    validation = torch.utils.data.DataLoader(Tokens(20, seed=2), batch_size=8)
    settings = {
        "gradient_clip_val": None if os.environ.get("SATURN_TEST_NO_CLIPPING") else 0.5,
        **({"precision": {"bf16": "bf16-mixed", "fp16": "16-mixed"}[precision()]} if precision() != "no" else {}),
        **ast.literal_eval(os.environ.get("SATURN_TEST_TRAINER_SETTING", "{}")),
    }  # (the tests' variations)
    trainer = trial.lightning_trainer(
        max_epochs=2, val_check_interval=3, logger=False, num_sanity_val_steps=0, **settings
    )
    trainer.fit(module, train, validation)
    trial.set_user_attr("curve", module.curve)
    trial.set_user_attr("facts", strategy_facts(trainer.strategy.model, trainer.optimizers[0]))
    trial.set_user_attr("global_step", trainer.global_step)
    trial.set_user_attr("compute_dtypes", sorted(module.dtypes))
    return float(trainer.callback_metrics["val_loss"])


class TokensData(L.LightningDataModule):
    """The same data as :func:`lightning_gpt2`'s, as a LightningDataModule."""

    def setup(self, stage: str) -> None:
        self.train, self.validation = Tokens(48, seed=1), Tokens(20, seed=2)

    def train_dataloader(self) -> torch.utils.data.DataLoader:
        return torch.utils.data.DataLoader(
            self.train, batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(3)
        )

    def val_dataloader(self) -> torch.utils.data.DataLoader:
        return torch.utils.data.DataLoader(self.validation, batch_size=8)


class _HangOnce(L.Callback):
    """A first run (not a resumed one) stops moving after optimizer step ``at``, so a test can kill it there."""

    def __init__(self, at: int) -> None:
        self.at, self.started_at = at, 0

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.started_at = trainer.global_step

    def on_train_batch_end(self, trainer: L.Trainer, *args) -> None:
        if self.started_at == 0 and trainer.global_step == self.at:
            import time

            time.sleep(3600)


def lightning_real_script(trial) -> float:
    """A Lightning script as users write it: a LightningDataModule, ModelCheckpoint on the validation loss,
    EarlyStopping, a CSVLogger, 3 epochs of 6 steps, validation every 3 steps. ``SATURN_TEST_PATIENCE`` sets
    EarlyStopping's patience (with a min_delta no validation meets: it stops after that many validations);
    ``SATURN_TEST_HANG_AT`` hangs a first run there (see ``_HangOnce``)."""
    from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
    from lightning.pytorch.loggers import CSVLogger

    module = TinyGPT2(trial.suggest_float("learning_rate", 1e-4, 1e-2, log=True))
    folder = os.environ["SATURN_TEST_LIGHTNING_DIR"]
    best = ModelCheckpoint(dirpath=os.path.join(folder, "best"), monitor="val_loss", save_top_k=1)
    patience = int(os.environ.get("SATURN_TEST_PATIENCE", "100"))
    stop = EarlyStopping(monitor="val_loss", patience=patience, min_delta=10.0 if patience < 100 else 0.0)
    callbacks = [
        best,
        stop,
        *([_HangOnce(int(os.environ["SATURN_TEST_HANG_AT"]))] if "SATURN_TEST_HANG_AT" in os.environ else []),
    ]
    logger = CSVLogger(save_dir=os.path.join(folder, "csv"), name="gpt2")
    trainer = trial.lightning_trainer(
        max_epochs=3, val_check_interval=3, num_sanity_val_steps=0, callbacks=callbacks, logger=logger
    )
    trainer.fit(module, datamodule=TokensData())
    if trial.is_real_run:
        trial.set_user_attr("global_step", trainer.global_step)
        trial.set_user_attr("best_model_path", best.best_model_path)
        trial.set_user_attr("log_dir", logger.log_dir)
        trial.set_user_attr("stopped_epoch", stop.stopped_epoch)
    return float(trainer.callback_metrics["val_loss"])
