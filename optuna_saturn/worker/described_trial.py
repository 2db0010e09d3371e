"""The trial a description relays its suggestions through (see :mod:`optuna_saturn.pools.describer_host`)."""

from __future__ import annotations

from typing import Any

from optuna_saturn.channel import ChannelClient
from optuna_saturn.training.relayed import RelayedTrial


class DescribedTrial(RelayedTrial):
    """``optuna.Trial``'s calls for one process alone: suggestions go to the real trial over the channel (the
    sampler decides, once: the real run gets the same values back), reads answer from the trial's snapshot. The
    stand-in trial of the description wraps it, and reports, prunes and sets nothing."""

    def __init__(self, channel: ChannelClient, known: dict[str, Any], *, number: int) -> None:
        self._channel = channel
        self._group = None
        self._profile = None
        self._known = known
        self._number = number

    @property
    def world_size(self) -> int:
        return 1
