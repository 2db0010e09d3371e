"""C9 and C10 of the GPU check (issue 46): bf16 on the GPU, and a model that fits only sharded under a memory cap.

- C9: a plain loop under ``torch.autocast(bfloat16)`` runs COMPLETE under ``single`` and under ``zero3-offload``
  (ZeRO-3, the sharded strategy one GPU can run), computes in bfloat16 under both, learns, and trains alike.
- C10: a model whose whole training state (3.2 GB) is over the executor's ``device_memory`` cap (2 GiB): ``single``
  is never planned, the trial runs under ``zero3-offload``, and the most the run ever held on its GPU at once is
  under half the model's own float32 size, so the whole model was never on the GPU (not even before ZeRO-3
  partitioned it: issue 36 #9).

Each trial records from inside itself where it ran, and each part checks it: its ``CUDA_VISIBLE_DEVICES`` is its
pool entry, ``LOCAL_RANK`` is "0", and its current CUDA device is 0.
"""

from __future__ import annotations

import os

from checks_common import DRY, check, cuda, executor, expected_entry, placement_problems, without_deepspeed

#: Largest relative difference allowed between zero3-offload's loss curve and single's under bf16 autocast: the
#: products are bfloat16's under both (8 bits of mantissa); what differs is where AdamW steps (the CPU, in float32,
#: under offload) and the order of float32 sums.
BF16_CURVE_TOLERANCE = 5e-2
#: C10's cap on what one device may use, against 3.2 GB for the whole model's training state (its float32
#: parameters, gradients and AdamW's two moments); in the dry run, 8 MiB against 17 MB.
SHARDED_CAP = "8MiB" if DRY else "2GiB"
#: The most C10's run may hold on its GPU at once, as a share of the model's own float32 size: ZeRO-3 gathers a
#: block or two at a time; a whole copy on the GPU, even for a moment, is over it.
NEVER_WHOLE_SHARE = 0.5


def _one_trial(part: str, strategy: str, objective, **options):
    import optuna

    study = optuna.create_study()
    study.enqueue_trial({"lr": 3e-3})
    executor(part, strategies=[strategy], profile=False, **options).optimize(study, objective, n_trials=1)
    return study.trials[0]


def _ran(trial, strategy: str) -> list[str]:
    """What is wrong with how one trial ran: its state, its strategy, its placement."""
    problems = placement_problems([trial.user_attrs.get("entry", {})], expected_entry(0))
    if trial.state.name != "COMPLETE":
        problems.append(f"{trial.state.name}: {trial.system_attrs.get('saturn:fail_reason', '')[:300]}")
    elif trial.system_attrs.get("saturn:strategy") != strategy:
        problems.append(f"ran under {trial.system_attrs.get('saturn:strategy')}, not {strategy}")
    return problems


# -- C9 ---------------------------------------------------------------------------------------------------------
def c9() -> bool:
    import review_objectives

    cannot = without_deepspeed("C9", "bf16 under zero3-offload")
    if DRY:
        os.environ.update(REVIEW_WIDTH="64", REVIEW_STEPS="6")
    ok, curves = True, {}
    for strategy in ("single",) if cannot is not None else ("single", "zero3-offload"):
        trial = _one_trial("C9", strategy, review_objectives.bf16_autocast)
        curve, dtypes = trial.user_attrs.get("curve", []), trial.user_attrs.get("compute_dtypes")
        problems = _ran(trial, strategy)
        if trial.state.name == "COMPLETE":
            problems += [] if dtypes == ["torch.bfloat16"] else [f"computed in {dtypes}"]
            problems += [] if curve and curve[-1] < curve[0] else [f"did not learn: {curve}"]
        curves[strategy] = curve
        ok &= check(
            "C9",
            "FAIL" if problems else "PASS",
            f"bf16 autocast under {strategy} on {'cuda:0' if cuda() else 'a CPU device'}: computed in {dtypes}, "
            f"loss {curve[0] if curve else None} -> {curve[-1] if curve else None} {'; '.join(problems)}",
        )
    if cannot is not None:
        return ok and cannot
    single, zero = curves["single"], curves["zero3-offload"]
    worst = max((abs(a - b) / max(abs(b), 1e-12) for a, b in zip(zero, single)), default=float("inf"))
    same = len(zero) == len(single) > 0 and worst <= BF16_CURVE_TOLERANCE
    return ok & check(
        "C9",
        "PASS" if same else "FAIL",
        f"zero3-offload trains like single: worst relative loss difference {worst:.1e} "
        f"(tolerance {BF16_CURVE_TOLERANCE:g})",
    )


# -- C10 --------------------------------------------------------------------------------------------------------
def c10() -> bool:
    import review_objectives

    cannot = without_deepspeed("C10", "a model that fits only sharded (zero3-offload)")
    if cannot is not None:
        return cannot
    if DRY:
        os.environ.update(REVIEW_WIDTH="512", REVIEW_DEPTH="4", REVIEW_STEPS="3")
    import optuna

    study = optuna.create_study()
    study.enqueue_trial({"lr": 3e-4})
    run = executor("C10", strategies=["single", "zero3-offload"], device_memory=SHARDED_CAP)
    run.optimize(study, review_objectives.fits_only_sharded, n_trials=1)
    trial = study.trials[0]
    planned = [o.get("strategy") for o in trial.system_attrs.get("saturn:options", [])]
    problems = _ran(trial, "zero3-offload")
    problems += [] if planned == ["zero3-offload"] else [f"planned {planned}, not zero3-offload alone"]
    ok = check(
        "C10",
        "FAIL" if problems else "PASS",
        f"a model whose state is over the cap of {SHARDED_CAP}: planned {planned}, ran "
        f"{trial.system_attrs.get('saturn:strategy')} {'; '.join(problems)}",
    )
    peak, whole = trial.user_attrs.get("gpu_peak_bytes"), trial.user_attrs.get("model_bytes") or 0
    if peak is None:
        return ok and check("C10", "SKIP", "the whole model never on the GPU: needs a GPU")
    return ok & check(
        "C10",
        "PASS" if peak < NEVER_WHOLE_SHARE * whole else "FAIL",
        f"the most on the GPU at once {peak / 2**20:.0f} MiB, against the model's own {whole / 2**20:.0f} MiB "
        f"(bound: {NEVER_WHOLE_SHARE:g} of it)",
    )
