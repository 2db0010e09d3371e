"""Predicting how long a step takes under an option nobody has measured for this workload.

Sweeps that search the architecture make every trial a new workload, and measuring every option of every new
workload costs more device time than it can save. The cost model predicts instead, from what was measured so far
(profiling runs, and the real runs of earlier trials, which are profiles too), per option family: a strategy on a
number of devices with a number of micro-batches, on one kind of hardware.

- A step's work is described by two numbers that the description run gives before anything is launched: FLOPs per
  step (``6 x parameters x tokens``, forward and backward; tokens are the batch's rows times its sequence length,
  or its rows for non-sequence data) and the parameters' bytes (what data-parallel strategies move per step).
- An option family with measurements of at least two different workloads fits ``seconds = a + b x FLOPs + c x
  bytes`` (non-negative least squares; with fewer distinct points, fewer terms), so both the fixed overhead of a
  step and its compute are learned. One measurement scales by FLOPs.
- A family without measurements is predicted from another family measured on the same workloads, through the
  median ratio of their step times where both were measured; failing that, from the prior: near-linear speed-up
  with a 10% loss per doubling of devices (``estimates.prior_speedup``), and one more micro-batch costing 5%.

Each prediction comes with a relative uncertainty (how far off it may be), which decides whether measuring the
option is worth its cost (:mod:`optuna_saturn.pricing.value_of_information`).
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

import numpy

from optuna_saturn.pricing.unprofiled import prior_speedup
from optuna_saturn.profiler import Work

#: (strategy, devices, micro-batches): what a step's speed depends on besides the workload and the hardware.
Family = tuple[str, int, int]

#: Relative uncertainty of a prediction from the prior alone / from another family's ratio / from one point / fit.
PRIOR_UNCERTAINTY = 0.6
RATIO_UNCERTAINTY = 0.35
SCALED_UNCERTAINTY = 0.3
MIN_FIT_UNCERTAINTY = 0.1
#: Each extra micro-batch (gradient accumulation) adds this much to a step, in the prior.
ACCUMULATION_OVERHEAD = 0.05


@dataclass(frozen=True)
class Prediction:
    seconds: float
    uncertainty: float  # relative: the truth is likely within seconds x (1 +- uncertainty)
    basis: str  # "fit", "scaled", "ratio" or "prior": how it was predicted


#: How many workloads' step times a family of options keeps (its latest).
POINTS_PER_FAMILY = 256


class CostModel:
    """Step times per option family, learned from measurements; one per hardware kind."""

    def __init__(self) -> None:
        self._points: dict[Family, dict[Work, float]] = defaultdict(dict)

    def observe(self, family: Family, work: Work, step_seconds: float) -> None:
        """A measured step time (the latest measurement of a workload replaces an earlier one). A family keeps
        its :data:`POINTS_PER_FAMILY` latest workloads: each prediction fits them, and a sweep whose workloads
        all differ would otherwise fit a growing history at every price."""
        if step_seconds > 0 and math.isfinite(step_seconds):
            points = self._points[family]
            points.pop(work, None)  # (re-inserted: the latest)
            points[work] = step_seconds
            while len(points) > POINTS_PER_FAMILY:
                del points[next(iter(points))]

    def measured(self, family: Family, work: Work) -> float | None:
        return self._points.get(family, {}).get(work)

    def predict(self, family: Family, work: Work) -> Prediction:
        """The step time of ``work`` under ``family`` (see the module's docstring for how)."""
        own = self._fit(family, work)
        if own is not None:
            return own
        ratio = self._through_other_families(family, work)
        if ratio is not None:
            return ratio
        return self._prior(family, work)

    def families(self) -> Iterable[Family]:
        return self._points.keys()

    def _fit(self, family: Family, work: Work) -> Prediction | None:
        points = self._points.get(family)
        if not points:
            return None
        if work in points:
            return Prediction(points[work], 0.0, "measured")
        works, seconds = list(points), numpy.array(list(points.values()))
        if len(works) == 1 or len({w.flops for w in works}) == 1:
            nearest = min(works, key=lambda w: abs(math.log(w.flops / work.flops)))
            return Prediction(points[nearest] * work.flops / nearest.flops, SCALED_UNCERTAINTY, "scaled")
        columns = [numpy.ones(len(works)), numpy.array([w.flops for w in works])]
        if len(works) >= 3 and len({w.param_bytes for w in works}) > 1:
            columns.append(numpy.array([w.param_bytes for w in works]))
        design = numpy.stack(columns, axis=1)
        coef = _nonnegative_least_squares(design, seconds)
        row = numpy.array([1.0, work.flops, work.param_bytes][: len(coef)])
        predicted = float(row @ coef)
        if predicted <= 0:
            return None
        residual = (design @ coef - seconds) / seconds
        spread = float(numpy.sqrt(numpy.mean(residual**2))) if len(works) > len(coef) else SCALED_UNCERTAINTY
        return Prediction(predicted, max(MIN_FIT_UNCERTAINTY, spread), "fit")

    def _through_other_families(self, family: Family, work: Work) -> Prediction | None:
        """Another family's prediction for this work, times the median ratio of the two families' step times on
        the workloads both measured."""
        target = self._points.get(family, {})
        best: Prediction | None = None
        for other, points in self._points.items():
            if other == family:
                continue
            shared = [w for w in points if w in target]
            if not shared:
                continue
            ratio = statistics.median(target[w] / points[w] for w in shared)
            base = self._fit(other, work)
            if base is None:
                continue
            candidate = Prediction(base.seconds * ratio, max(RATIO_UNCERTAINTY, base.uncertainty), "ratio")
            if best is None or candidate.uncertainty < best.uncertainty:
                best = candidate
        return best

    def _prior(self, family: Family, work: Work) -> Prediction:
        """From any measured family of this hardware, scaled by the prior's device and micro-batch factors; with
        nothing measured at all, a placeholder (a second per step at 1e12 FLOPs) that any measurement replaces."""
        _, devices, accumulation = family
        estimates = []
        for other in self._points:
            base = self._fit(other, work)
            if base is not None:  # as one device without accumulation would take, by the prior
                estimates.append(base.seconds * prior_speedup(other[1]) / _accumulation_cost(other[2]))
        single = statistics.median(estimates) if estimates else work.flops / 1e12
        return Prediction(
            single / prior_speedup(devices) * _accumulation_cost(accumulation),
            PRIOR_UNCERTAINTY if estimates else 1.0,
            "prior",
        )


def _accumulation_cost(micro_batches: int) -> float:
    return 1.0 + ACCUMULATION_OVERHEAD * (micro_batches - 1)


def _nonnegative_least_squares(design: numpy.ndarray, target: numpy.ndarray) -> numpy.ndarray:
    """Least squares with every coefficient >= 0 (a step cannot get faster with more work), by dropping the
    most negative term until none is left (enough for three terms)."""
    active = list(range(design.shape[1]))
    while active:
        coef, *_ = numpy.linalg.lstsq(design[:, active], target, rcond=None)
        if (coef >= 0).all():
            full = numpy.zeros(design.shape[1])
            full[active] = coef
            return full
        del active[int(numpy.argmin(coef))]
    return numpy.zeros(design.shape[1])
