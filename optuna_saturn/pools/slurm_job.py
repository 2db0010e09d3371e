"""Giving a SLURM job's node back while the job runs on: the SLURM pool's half of a deadline's release.

Why shrinking the job (``scontrol update JobId=N NodeList=<the nodes kept>``): SLURM rents a job's nodes together,
and a running job may shrink (every SLURM release since 2.x; 22.05 on the test cluster), while it cannot give back
part of a node. The node is IDLE for other jobs at once, and the job runs on with the others: the executor, the
kept nodes' hosts and their trials go on undisturbed. Two limits, both SLURM's:

- the node of a batch job's script (``BatchHost``: where an ``sbatch`` script, and so the executor, runs) cannot be
  removed (SLURM answers "Invalid node name specified"): that node is never given back;
- after the shrink, the job's environment in the process that runs in the allocation (``SLURM_JOB_NODELIST``,
  ``SLURM_NNODES``, ``SLURM_JOB_CPUS_PER_NODE``...) is out of date: a later plain ``srun`` there fails, its node
  count not the job's. SLURM writes the fix itself, as a script (``slurm_job_N_resize.sh``, in the working folder
  of the ``scontrol`` that shrank the job, when that ``scontrol`` runs in the job); it is written in a temporary
  folder here (not the user's) and applied to this process's environment, so that what the user's script runs after
  the sweep sees the job as it is.
"""

from __future__ import annotations

import os
import shlex
import tempfile
from collections.abc import MutableMapping
from pathlib import Path

from optuna_saturn.pools.slurm_allocation import scontrol


def job_fields(job_id: str) -> dict[str, str]:
    """``scontrol --oneliner show job``'s fields of job ``job_id`` (``NodeList``, ``BatchFlag``, ``BatchHost``...)."""
    answer = scontrol(["--oneliner", "show", "job", job_id])
    return dict(f.split("=", 1) for f in answer.split() if "=" in f)


def fixed_node(job_id: str) -> str | None:
    """The node that cannot leave job ``job_id``: a batch job's ``BatchHost`` (its script runs there), else None."""
    fields = job_fields(job_id)
    return fields.get("BatchHost") if fields.get("BatchFlag") == "1" else None


def shrink(job_id: str, keep: list[str], env: MutableMapping[str, str] = os.environ) -> None:
    """Job ``job_id`` keeps only the nodes ``keep`` (the others go back to SLURM at once); the allocation's
    environment in ``env`` is brought up to date as SLURM says (see the module's docstring). Raises with SLURM's
    answer where it refuses."""
    with tempfile.TemporaryDirectory(prefix="saturn-slurm-resize-") as folder:
        scontrol(["update", f"JobId={job_id}", f"NodeList={','.join(keep)}"], cwd=folder)
        script = Path(folder, f"slurm_job_{job_id}_resize.sh")
        if script.exists() and env.get("SLURM_JOB_ID") == job_id:
            apply_resize_script(script.read_text(encoding="utf-8"), env)


def apply_resize_script(script: str, env: MutableMapping[str, str]) -> None:
    """What SLURM's ``slurm_job_N_resize.sh`` does (``export NAME="value"`` and ``unset NAME`` lines), to ``env``."""
    for line in script.splitlines():
        words = shlex.split(line)
        if len(words) == 2 and words[0] == "export" and "=" in words[1]:
            name, _, value = words[1].partition("=")
            env[name] = value
        elif len(words) == 2 and words[0] == "unset":
            env.pop(words[1], None)
