"""How the planner weighs a trial's options against each other, beyond their runtimes: caution about an option
nobody measured, and a preference for the option that spends fewer device-seconds when the plan ends as soon
either way. Pure functions of the options; the options policy (:mod:`optuna_saturn.sweep.options`) applies them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from optuna_saturn.planner import Option
from optuna_saturn.pricing.prices import PricedOption, TrialPrice

#: Among options that finish the plan equally soon, prefer the one that spends fewer device-seconds: each option
#: is priced to the planner this much longer per unit of area beyond the trial's most efficient option.
EFFICIENCY_TIE_BREAK = 0.02
#: A trial likely pruned at its next rung is offered the options that spend at most this share more device-seconds
#: than its most efficient one.
EFFICIENT_SLACK = 0.1
#: An option nobody measured for the trial is weighed as if it took this share of its relative uncertainty longer
#: (a prior's 1.8x on 2 devices was chosen for 4 trials and ran at 1.35x).
CAUTION = 0.5


def weighed(options: Sequence[Option], priced: Sequence[PricedOption]) -> list[Option]:
    """``options`` (one per ``priced``) as the planner weighs them: an option nobody measured for the trial is
    lengthened by :data:`CAUTION` times its relative uncertainty."""
    return [
        o if p.measured else replace(o, runtime=o.runtime * (1 + CAUTION * p.uncertainty))
        for o, p in zip(options, priced, strict=True)
    ]


def standing_for(price: TrialPrice) -> list[Option]:
    """A trial's options as the trials to come are planned like it (weighed, at their full length)."""
    return weighed([p.option for p in price.options], price.options)


def tie_broken(options: Sequence[Option]) -> list[Option]:
    """``options`` each a little longer the more device-seconds it spends beyond the most efficient one."""
    if not options:
        return []
    least = min(o.runtime * o.devices for o in options) or 1.0
    return [
        replace(o, runtime=o.runtime * (1 + EFFICIENCY_TIE_BREAK * (o.runtime * o.devices / least - 1)))
        for o in options
    ]


def fitting(options: Sequence[Option], largest_node: int) -> list[Option]:
    """The options that fit a node (all, unless nodes were lost)."""
    return [o for o in options if o.devices <= largest_node]


def most_efficient(options: Sequence[Option], largest_node: int) -> list[Option]:
    """``options`` that spend at most :data:`EFFICIENT_SLACK` more device-seconds than the most efficient one that
    fits a node (all of them if none fits: what fits is :func:`fitting`'s to say)."""
    least = min((o.runtime * o.devices for o in fitting(options, largest_node)), default=None)
    if least is None:
        return list(options)
    return [o for o in options if o.runtime * o.devices <= least * (1 + EFFICIENT_SLACK)]
