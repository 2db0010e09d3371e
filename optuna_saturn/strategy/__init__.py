"""Parallelism strategies as declarative templates (DESIGN decision 2).

A strategy is a TOML file: which launcher starts the trial's processes, which engine applies the strategy to the
user's model inside the worker, which device counts make sense, and its knobs. Engines are named by the one
registry of engines (:mod:`optuna_saturn.strategy.engine_registry`), and what a template may set for its engine
is the engine's to say (:mod:`optuna_saturn.strategy.engine_traits`). The package ships the files of the
top-level ``strategies/`` folder; users add their own folders, or an installed package adds them through the
``optuna_saturn.strategies`` entry-point group. Templates are data only: nothing is unpickled or executed.
"""

from __future__ import annotations

import importlib.resources
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from optuna_saturn.strategy.engine_registry import EngineError, engine_names, traits_of
from optuna_saturn.strategy.engine_traits import EngineTraits

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

LAUNCHERS = ("torchrun", "accelerate", "deepspeed")
ENTRY_POINT_GROUP = "optuna_saturn.strategies"
_KEYS = {
    "name",
    "description",
    "launcher",
    "engine",
    "min_devices",
    "max_devices",
    "power_of_two",
    "knobs",
    "launcher_config",
    "one_process",
}


class StrategyError(ValueError):
    """A strategy template is malformed, unknown, or cannot run on the devices at hand."""


@dataclass(frozen=True)
class Strategy:
    """A validated strategy template."""

    name: str
    launcher: str
    engine: str
    description: str = ""
    min_devices: int = 1
    max_devices: int | None = None
    power_of_two: bool = False
    knobs: Mapping[str, Any] = field(default_factory=dict)
    launcher_config: Mapping[str, Any] = field(default_factory=dict)
    source: str = ""
    #: One process drives all the trial's devices: CPU devices only, whose cores all become its threads (the
    #: other devices' workers lend their cores and wait). See :mod:`optuna_saturn.worker.one_process`.
    one_process: bool = False

    @property
    def engine_traits(self) -> EngineTraits:
        """What its engine is, as the executor's side needs to know it (state per device, checkpoints, ...)."""
        return traits_of(self.engine)

    def allows(self, devices: int) -> bool:
        if devices < self.min_devices or (self.max_devices is not None and devices > self.max_devices):
            return False
        return not self.power_of_two or devices & (devices - 1) == 0

    @property
    def accumulation_factors(self) -> tuple[int, ...]:
        """Micro-batches per device batch to try, fewest first: each split keeps the global batch but needs
        less activation memory, and is slower, so the profiler tries the next one only after an out-of-memory."""
        return tuple(self.knobs.get("gradient_accumulation", (1,)))

    def accumulation_factors_for(self, global_batch: int | None, devices: int) -> list[int]:
        """The factors that split each device's share of a ``global_batch`` evenly over ``devices`` devices (all,
        if the batch size is unknown; then a bad split is reported by the run)."""
        factors = list(self.accumulation_factors)
        if global_batch is None or global_batch % devices:
            return factors
        per_device = global_batch // devices
        return [a for a in factors if per_device % a == 0] or factors[:1]

    def device_counts(self, pool_size: int) -> list[int]:
        """Every allowed device count that fits a pool (node) of ``pool_size`` devices."""
        return [n for n in range(1, pool_size + 1) if self.allows(n)]

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "launcher": self.launcher,
            "engine": self.engine,
            "description": self.description,
            "min_devices": self.min_devices,
            "max_devices": self.max_devices,
            "power_of_two": self.power_of_two,
            "knobs": dict(self.knobs),
            "launcher_config": dict(self.launcher_config),
            "source": self.source,
            "one_process": self.one_process,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Strategy:
        return cls(**data)


def parse_strategy(data: Mapping[str, Any], *, source: str) -> Strategy:
    """Validate one template's table; errors name the file and the fix."""
    unknown = set(data) - _KEYS
    if unknown:
        raise StrategyError(f"{source}: unknown key(s) {sorted(unknown)}; allowed keys are {sorted(_KEYS)}.")
    for key in ("name", "launcher", "engine"):
        if not isinstance(data.get(key), str) or not data[key]:
            raise StrategyError(f"{source}: '{key}' is required and must be a non-empty string.")
    if data["launcher"] not in LAUNCHERS:
        raise StrategyError(f"{source}: launcher {data['launcher']!r} is not one of {list(LAUNCHERS)}.")
    try:
        engine = traits_of(data["engine"])  # (an unknown name's error lists the known ones)
    except EngineError as exc:
        raise StrategyError(f"{source}: {exc}") from exc
    min_devices = data.get("min_devices", 1)
    max_devices = data.get("max_devices")
    if not isinstance(min_devices, int) or min_devices < 1:
        raise StrategyError(f"{source}: min_devices must be an int >= 1, got {min_devices!r}.")
    if max_devices is not None and (not isinstance(max_devices, int) or max_devices < min_devices):
        raise StrategyError(
            f"{source}: max_devices must be an int >= min_devices ({min_devices}), got {max_devices!r}."
        )
    one_process = data.get("one_process", False)
    if not isinstance(one_process, bool):
        raise StrategyError(f"{source}: one_process must be true or false, got {one_process!r}.")
    if one_process and (not engine.runs_one_process or data["launcher"] != "torchrun"):
        one_process_engines = [name for name in engine_names() if traits_of(name).runs_one_process]
        raise StrategyError(
            f"{source}: one_process = true needs an engine that runs one process ({one_process_engines}) and "
            "launcher = 'torchrun' (one warm worker runs the objective on the cores of all the trial's CPU devices)."
        )
    if engine.runs_one_process and not one_process and (max_devices or 0) != 1:
        raise StrategyError(
            f"{source}: engine {engine.name!r} runs one process; set max_devices = 1 (or one_process = "
            "true, for one process on the cores of several CPU devices)."
        )
    for key in ("knobs", "launcher_config"):
        if not isinstance(data.get(key, {}), Mapping):
            raise StrategyError(f"{source}: '{key}' must be a table.")
    knobs = dict(data.get("knobs", {}))
    for key, value in knobs.items():
        problem = engine.knob_problem(key, value)
        if problem is not None:
            raise StrategyError(f"{source}: {problem}")
    config = data.get("launcher_config", {})
    if "gradient_accumulation_steps" in config or "train_batch_size" in config:
        raise StrategyError(
            f"{source}: set gradient accumulation with knobs.gradient_accumulation, not in launcher_config "
            "(the trial's own loop fixes the global batch; the planner chooses the accumulation)."
        )
    return Strategy(
        name=data["name"],
        launcher=data["launcher"],
        engine=data["engine"],
        description=data.get("description", ""),
        min_devices=min_devices,
        max_devices=max_devices,
        power_of_two=bool(data.get("power_of_two", False)),
        knobs=knobs,
        launcher_config=dict(data.get("launcher_config", {})),
        source=source,
        one_process=one_process,
    )


def _read_folder(folder: Any) -> Iterable[Strategy]:
    for entry in sorted(folder.iterdir(), key=lambda p: p.name):
        if entry.name.endswith(".toml"):
            try:
                data = tomllib.loads(entry.read_text(encoding="utf-8"))
            except tomllib.TOMLDecodeError as exc:
                raise StrategyError(f"{entry}: not valid TOML: {exc}") from exc
            yield parse_strategy(data, source=str(entry))


def builtin_folder() -> Any:
    return importlib.resources.files("optuna_saturn._builtin_strategies")


def load_strategies(
    *, folders: Sequence[str | os.PathLike[str]] = (), use_entry_points: bool = True
) -> dict[str, Strategy]:
    """All known strategies: built-in, then entry points, then ``folders`` (later ones override by name)."""
    sources: list[Any] = [builtin_folder()]
    if use_entry_points:
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            sources.append(importlib.resources.files(ep.value.split(":")[0]))
    for folder in folders:
        path = Path(folder)
        if not path.is_dir():
            raise StrategyError(f"Strategy folder {str(path)!r} does not exist or is not a folder.")
        sources.append(path)
    known: dict[str, Strategy] = {}
    for source in sources:
        for strategy in _read_folder(source):
            known[strategy.name] = strategy
    return known


def select_strategies(
    names: Sequence[str] | None,
    pool_size: int,
    *,
    device_kind: str = "cpu",
    folders: Sequence[str | os.PathLike[str]] = (),
) -> list[Strategy]:
    """The strategies a sweep may use: the named ones that fit a pool of ``pool_size`` devices of
    ``device_kind`` (one-process strategies run on CPU devices only). None: every known one but the one-process
    ones, which are asked for by name: a cold sweep cannot find them (the prior prices them as data parallelism
    on as many devices, and they are measured only on idle devices), and where they win depends on the model (on
    2 CPU cores, a small GPT-2 trained faster on ``threads`` x2 than on ``ddp`` x2, a larger one slower)."""
    known = load_strategies(folders=folders)
    if names is None:
        chosen = [s for s in known.values() if not s.one_process]
    else:
        if isinstance(names, str):
            raise StrategyError(f"strategies must be a list of names, e.g. [{names!r}], not a string.")
        missing = [n for n in names if n not in known]
        if missing:
            raise StrategyError(f"Unknown strategy {missing[0]!r}. Known strategies: {sorted(known)}.")
        chosen = [known[n] for n in names]
        on_cpu_only = [s.name for s in chosen if s.one_process and device_kind != "cpu"]
        if on_cpu_only:
            raise StrategyError(
                f"Strategy {on_cpu_only[0]!r} runs one process on the cores of several CPU "
                f"devices; these devices are {device_kind}. Leave it out of strategies=."
            )
    usable = [s for s in chosen if s.device_counts(pool_size)]
    if not usable:
        raise StrategyError(
            f"None of the strategies {[s.name for s in chosen]} can run on {pool_size} device(s): "
            + "; ".join(f"{s.name} needs >= {s.min_devices}" for s in chosen)
            + ". Add devices or include 'single'."
        )
    return usable


def nothing_to_choose(strategies: Sequence[Strategy], largest: int) -> bool:
    """Whether every trial has one option: one strategy, on one device (``single``, or a pool of one device, or of
    MIG instances). Then no trial needs describing or measuring to be planned: it runs as soon as a device is
    free, as under plain Optuna's ``n_jobs``."""
    return len(strategies) == 1 and strategies[0].device_counts(largest) == [1]
