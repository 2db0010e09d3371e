"""A real, small language-model sweep on CPU: GPT-2 built from a config, trained on text that ships with Python.

Run:  python examples/gpt2_sweep.py              (8 trials, SQLite storage, every core as a CPU device)
Then: optuna-dashboard sqlite:///saturn-example.sqlite3

Nothing is downloaded: the model is built from a ``GPT2Config``, the text is ``pydoc_data.topics`` (Python's own
help pages, 0.46 M characters), and a byte-level BPE tokenizer is trained on it locally in about a second.
"""

from __future__ import annotations

import argparse
import hashlib
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

import optuna
import torch

from optuna_saturn import SaturnExecutor
from optuna_saturn.study.urls import without_password

SEQ_LEN = 64
VOCAB_SIZE = 2000
TRAIN_STEPS = 120
EVAL_EVERY = 30
DATA_DIR = Path(os.environ.get("SATURN_EXAMPLE_DATA", Path.home() / ".cache" / "optuna-saturn" / "example-data"))


def corpus() -> str:
    from pydoc_data.topics import topics

    return "\n\n".join(topics[key] for key in sorted(topics))


def token_ids() -> torch.Tensor:
    """Tokenised corpus, cached on disk (written atomically: concurrent trials may race to create it)."""
    text = corpus()
    key = hashlib.sha256(f"{VOCAB_SIZE}:{text}".encode()).hexdigest()[:16]
    cache = DATA_DIR / f"tokens-{key}.pt"
    if cache.exists():
        return torch.load(cache)
    from tokenizers import ByteLevelBPETokenizer

    tokenizer = ByteLevelBPETokenizer()
    tokenizer.train_from_iterator([text], vocab_size=VOCAB_SIZE, min_frequency=2, show_progress=False)
    ids = torch.tensor(tokenizer.encode(text).ids, dtype=torch.long)
    DATA_DIR.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_suffix(f".{os.getpid()}.tmp")
    torch.save(ids, tmp)
    os.replace(tmp, cache)
    return ids


def blocks(ids: torch.Tensor) -> torch.utils.data.TensorDataset:
    n = (len(ids) - 1) // SEQ_LEN
    return torch.utils.data.TensorDataset(ids[: n * SEQ_LEN].view(n, SEQ_LEN))


def search_space(trial) -> tuple[float, int, int, int]:
    """What every example searches: learning rate, width, depth and global batch size."""
    return (
        trial.suggest_float("lr", 1e-4, 1e-2, log=True),
        trial.suggest_categorical("n_embd", [32, 64, 96]),
        trial.suggest_int("n_layer", 1, 3),
        trial.suggest_categorical("batch_size", [8, 16, 32]),
    )


def train_and_validation() -> tuple[torch.utils.data.TensorDataset, torch.utils.data.TensorDataset]:
    """The first 90% of the tokenised text for training, the rest for validation, in rows of SEQ_LEN tokens."""
    ids = token_ids()
    split = int(len(ids) * 0.9)
    return blocks(ids[:split]), blocks(ids[split:])


def tiny_gpt2(n_embd: int, n_layer: int, seed: int):
    """GPT-2 built from a config (nothing downloaded), without dropout, initialised from ``seed``."""
    import transformers
    from transformers import GPT2Config, GPT2LMHeadModel

    transformers.logging.set_verbosity_error()
    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=VOCAB_SIZE,
        n_positions=SEQ_LEN,
        n_embd=n_embd,
        n_layer=n_layer,
        n_head=4,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=0,
    )
    return GPT2LMHeadModel(config)


def mean_validation_loss(trial, model, val_loader) -> float:
    """The mean loss over every validation row, whatever the strategy: each rank evaluates its rows of each batch,
    and the ranks' means are combined weighted by their rows."""
    model.eval()
    total, rows = 0.0, 0
    with torch.no_grad():
        for (x,) in val_loader:
            total += model(input_ids=x.to(trial.device), labels=x.to(trial.device)).loss.item() * len(x)
            rows += len(x)
    model.train()
    return trial.reduce_mean(total / rows, weight=rows)


def objective(trial) -> float:
    lr, n_embd, n_layer, batch_size = search_space(trial)
    train, val = train_and_validation()
    model = tiny_gpt2(n_embd, n_layer, seed=trial.number)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    train_loader = torch.utils.data.DataLoader(train, batch_size=batch_size, shuffle=True, drop_last=True)
    val_loader = torch.utils.data.DataLoader(val, batch_size=32)
    model, optimizer, train_loader, val_loader = trial.prepare(model, optimizer, train_loader, val_loader)

    def validation_loss() -> float:
        return mean_validation_loss(trial, model, val_loader)

    batches = iter(train_loader)
    loss = float("nan")
    for step in trial.steps(TRAIN_STEPS):
        try:
            (x,) = next(batches)
        except StopIteration:
            batches = iter(train_loader)
            (x,) = next(batches)
        optimizer.zero_grad()
        for part in trial.micro_batches(x.to(trial.device)):  # one part, unless the batch must be split to fit
            loss = model(input_ids=part, labels=part).loss
            trial.backward(loss)
        optimizer.step()
        if (step + 1) % EVAL_EVERY == 0:
            loss = validation_loss()
            trial.report(loss, step + 1)
            if trial.should_prune():
                raise optuna.TrialPruned()
    final = validation_loss()
    if trial.is_real_run and trial.is_main_process:  # (not while describing or profiling: they stop early)
        print(f"trial {trial.number}: validation loss {final:.4f} after {TRAIN_STEPS} steps, {trial.params}")
    return final


def main(
    objective=objective,
    *,
    description: str = __doc__,
    storage: str = "sqlite:///saturn-example.sqlite3",
    study_name: str = "gpt2-tiny",
) -> None:
    """Parse the command line, run the sweep, print the best trial (the other examples reuse it)."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n-trials", type=int, default=8)
    parser.add_argument("--storage", default=storage)
    parser.add_argument("--study", "--study-name", dest="study_name", default=study_name)
    parser.add_argument("--devices", default="auto", help="'auto', 'cpu', or a number of devices")
    parser.add_argument("--strategies", default="single,ddp", help="comma-separated strategy names")
    parser.add_argument("--isolate-network", action="store_true", help="each trial in a loopback-only namespace")
    args = parser.parse_args()

    token_ids()  # build the tokenizer and token cache once, before trials start in parallel
    study = optuna.create_study(
        study_name=args.study_name,
        storage=args.storage,
        load_if_exists=True,
        direction="minimize",
        sampler=optuna.samplers.TPESampler(seed=0, n_startup_trials=4),
        pruner=optuna.pruners.MedianPruner(n_startup_trials=3, n_warmup_steps=EVAL_EVERY),
    )
    devices = int(args.devices) if args.devices.isdigit() else args.devices
    executor = SaturnExecutor(
        devices=devices, strategies=args.strategies.split(","), isolate_network=args.isolate_network
    )
    executor.optimize(study, objective, n_trials=args.n_trials)

    if not any(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials):
        raise SystemExit("No trial completed; see the trials' saturn:fail_reason and their logs.")
    best = study.best_trial
    print(f"\nBest trial #{best.number}: validation loss {best.value:.4f} with {best.params}")
    print(f"  ran as {best.system_attrs['saturn:strategy']} on {best.system_attrs['saturn:devices']}")
    print(f"See the sweep:  optuna-dashboard {without_password(args.storage)}")


if __name__ == "__main__":
    main()
