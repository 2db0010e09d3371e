"""``optuna-saturn run``'s sampler, pruner and seed: the user's, as ``study.optimize`` would get them in Python.

Why: "your sampler stays yours" must hold from the shell too. A sampler or pruner is named by its class in
``optuna.samplers`` / ``optuna.pruners`` (``TPESampler``), by a dotted path (``optuna_integration.BoTorchSampler``)
or from the user's own file (``sweep.py:make_sampler``: a class or a function that returns one), with its keyword
arguments as a JSON object. ``--seed`` goes to the sampler's ``seed`` argument, as Optuna's examples pass it.
"""

from __future__ import annotations

import importlib
import inspect
import json
from typing import Any

import optuna

from optuna_saturn.cli.app import fail
from optuna_saturn.cli.loading import load_objective

#: What ``--pruner none`` means: no pruning, as Optuna's ``NopPruner``.
NO_PRUNER = ("none", "nop", "NopPruner")


def make_sampler(name: str | None, arguments: str | None, seed: int | None) -> optuna.samplers.BaseSampler | None:
    """The sampler ``--sampler``/``--sampler-args``/``--seed`` ask for; None leaves Optuna's default (TPE)."""
    if name is None:
        if arguments is not None:
            fail(
                "--sampler-args needs --sampler, e.g. --sampler TPESampler --sampler-args '{\"n_startup_trials\": 5}'."
            )
        return None if seed is None else optuna.samplers.TPESampler(seed=seed)
    kwargs = _arguments(arguments, "--sampler-args")
    factory = _resolve(name, optuna.samplers, optuna.samplers.BaseSampler, "--sampler")
    if seed is not None:
        if "seed" in kwargs and kwargs["seed"] != seed:
            fail(f"--seed {seed} and --sampler-args' seed {kwargs['seed']} differ: give the seed once.")
        if not _takes(factory, "seed"):
            fail(f"--seed: {name} takes no seed argument. Leave --seed out, or pick a sampler that takes one.")
        kwargs["seed"] = seed
    sampler: optuna.samplers.BaseSampler = _build(factory, kwargs, optuna.samplers.BaseSampler, "--sampler", name)
    return sampler  # (_build checked that it is one)


def make_pruner(name: str | None, arguments: str | None) -> optuna.pruners.BasePruner | None:
    """The pruner ``--pruner``/``--pruner-args`` ask for; None leaves Optuna's default (the median pruner)."""
    if name is None:
        if arguments is not None:
            fail("--pruner-args needs --pruner, e.g. --pruner MedianPruner --pruner-args '{\"n_warmup_steps\": 10}'.")
        return None
    if name in NO_PRUNER:
        name = "NopPruner"
    factory = _resolve(name, optuna.pruners, optuna.pruners.BasePruner, "--pruner")
    pruner: optuna.pruners.BasePruner = _build(
        factory, _arguments(arguments, "--pruner-args"), optuna.pruners.BasePruner, "--pruner", name
    )
    return pruner  # (_build checked that it is one)


def _arguments(text: str | None, option: str) -> dict[str, Any]:
    if text is None:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        fail(f"{option} is not JSON ({exc.msg}): give a JSON object, e.g. '{{\"seed\": 0}}' (quoted for the shell).")
    if not isinstance(value, dict):
        fail(f"{option} must be a JSON object of keyword arguments, e.g. '{{\"seed\": 0}}'; got {text!r}.")
    return value


def _resolve(name: str, namespace: Any, base: type, option: str) -> Any:
    """A class of Optuna's by name, a dotted path, or ``file.py:attribute`` / ``module:attribute``."""
    if ":" in name:
        return load_objective(name)
    if "." not in name:
        found = getattr(namespace, name, None)
        if isinstance(found, type) and issubclass(found, base):
            return found
        known = sorted(
            n
            for n in dir(namespace)
            if isinstance(getattr(namespace, n), type) and issubclass(getattr(namespace, n), base)
        )
        known = [n for n in known if not n.startswith("Base")]
        fail(
            f"{option} {name!r} is not one of Optuna's: {', '.join(known)}. Your own: give it as "
            "path/to/file.py:ClassOrFunction or package.module.Class."
        )
    module_name, _, attribute = name.rpartition(".")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        fail(f"{option} {name!r}: cannot import {module_name!r} ({exc}). Install it, or check the name.")
    found = getattr(module, attribute, None)
    if found is None or not callable(found):
        fail(f"{option} {name!r}: {module_name!r} has no class or function {attribute!r}.")
    return found


def _takes(factory: Any, argument: str) -> bool:
    try:
        parameters = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return True  # (cannot tell: let the call say)
    return any(p.name == argument or p.kind == p.VAR_KEYWORD for p in parameters)


def _build(factory: Any, kwargs: dict[str, Any], base: type, option: str, name: str) -> Any:
    try:
        made = factory(**kwargs)
    except TypeError as exc:
        try:
            signature = f"{name}{inspect.signature(factory)}"
        except (TypeError, ValueError):
            signature = name
        fail(f"{option} {name} does not take these arguments ({exc}). It takes: {signature}.")
    except ValueError as exc:
        fail(f"{option} {name}: {exc}")
    if not isinstance(made, base):
        fail(f"{option} {name} gave a {type(made).__name__}, not an Optuna {base.__name__.removeprefix('Base')}.")
    return made
