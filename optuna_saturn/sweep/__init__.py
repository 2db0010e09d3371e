"""The sweep: one loop, and the small policies it asks what to do (DESIGN.md decision 12).

The loop (:mod:`~optuna_saturn.sweep.loop`) waits on a pool, calls the hooks of every policy in its one list
(:mod:`~optuna_saturn.sweep.policy`), and carries out the decisions they return through its effects
(:mod:`~optuna_saturn.sweep.effects`); :func:`~optuna_saturn.sweep.assemble.assemble` builds it and the list.
The same loop runs a real sweep on a pool of processes and wall time, and a simulated one on a simulated pool
and virtual time.
"""

from optuna_saturn.sweep.assemble import assemble
from optuna_saturn.sweep.loop import Sweep
from optuna_saturn.sweep.settings import SweepSettings

__all__ = ["Sweep", "SweepSettings", "assemble"]
