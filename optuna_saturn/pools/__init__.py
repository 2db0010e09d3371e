"""Pools run the sweep's jobs, behind one protocol (:mod:`~optuna_saturn.pools.protocol`).

The pools of processes are the only part of optuna-saturn that starts processes: warm workers on this machine
(:mod:`~optuna_saturn.pools.warm`, forked by :mod:`~optuna_saturn.pools.warm_host`), on a Ray cluster
(:mod:`~optuna_saturn.pools.ray`) or on a SLURM allocation's nodes (:mod:`~optuna_saturn.pools.slurm`), and a
launcher per job for strategies whose launcher must own the processes (:mod:`~optuna_saturn.pools.launched`), put
together by :mod:`~optuna_saturn.pools.processes`. The simulated pool (:mod:`~optuna_saturn.simulation.pool`)
starts none: its jobs end at virtual times.
"""

from optuna_saturn.pools.kinds import PoolKind
from optuna_saturn.pools.local_kind import LocalPool
from optuna_saturn.pools.protocol import JobEnd, JobRequest, Pool, PoolBroken, Task
from optuna_saturn.pools.ray_kind import RayPool
from optuna_saturn.pools.slurm_kind import SlurmPool

__all__ = ["JobEnd", "JobRequest", "LocalPool", "Pool", "PoolBroken", "PoolKind", "RayPool", "SlurmPool", "Task"]
