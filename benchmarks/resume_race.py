"""A hostile storage writer's resume race, run again and again: never is a checkpoint outside the sweep's own
checkpoint root accepted for loading (issue 38's target; the reliability review's ``c4_resume_race.py`` forced
one interleaving, this loops over all that a real race gives).

Another user (uid 12345) who can write trial attributes enqueues retries whose ``saturn:checkpoint`` names a tree
under a world-writable sticky folder (as ``/tmp``), with the same study-folder name as the sweep's, and renames
that tree in and out of place in a loop, as fast as it can, while the sweep plans each retry's resume
(``Resumes.inherited``: the executor's check, then the existence check) and the worker checks again before it
loads (``checkpoint_paths.refusal``). A second kind of attempt names a path that climbs out of the root with
``..``; a third, the sweep's own root through a link the attacker owns.

Usage (as root, to own files as another uid): ``python benchmarks/resume_race.py [--attempts 1000]``.
"""

from __future__ import annotations

import argparse
import collections
import os
import pathlib
import tempfile
import threading
import time

import _common  # noqa: F401

from optuna_saturn.devices import Device
from optuna_saturn.sweep.resumes import Resumes
from optuna_saturn.sweep.state import SweepState
from optuna_saturn.training import checkpoint
from optuna_saturn.training.checkpoint_paths import make_private_folders, refusal

ATTACKER = 12345
STUDY_FOLDER = "study-0123abcd"


def plant(tree: pathlib.Path) -> None:
    (tree / "trial-3" / "step-4").mkdir(parents=True)
    (tree / "trial-3" / "step-4" / "saturn-checkpoint.json").write_text("{}")
    for path in (
        tree,
        tree / "trial-3",
        tree / "trial-3" / "step-4",
        tree / "trial-3" / "step-4" / "saturn-checkpoint.json",
    ):
        os.chown(path, ATTACKER, ATTACKER)


class Retry:
    """A retried trial whose checkpoint attribute the attacker wrote."""

    def __init__(self, number: int, path: str) -> None:
        self.number = number
        record = {"path": path, "step": 4, "format": checkpoint.DCP, "strategy": "single", "world_size": 1}
        self.user_attrs = {"saturn:retry_of": 3, "saturn:checkpoint": {**record, "saved_at": 0.0}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--attempts", type=int, default=1000)
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("Run as root: the attacker's files must belong to another uid.")
    base = pathlib.Path(tempfile.mkdtemp(prefix="saturn-resume-race-"))
    shared = base / "tmp"  # stands for /tmp: root's, 1777
    shared.mkdir()
    os.chmod(shared, 0o1777)
    root = base / "home" / "runs" / "checkpoints" / STUDY_FOLDER  # the sweep's own root
    make_private_folders(root)
    (root / "trial-3" / "step-4").mkdir(parents=True, mode=0o700)  # (its own checkpoint, which is accepted)
    os.chmod(root / "trial-3", 0o700)
    (root / "trial-3" / "step-4" / "saturn-checkpoint.json").write_text("{}")
    staged, evil = shared / "staged", shared / STUDY_FOLDER
    plant(staged)
    link = shared / "link-to-root"
    link.symlink_to(root)
    os.lchown(link, ATTACKER, ATTACKER)

    stop = threading.Event()
    swaps = [0]

    def swap() -> None:  # the attacker's loop: the tree in place, then gone, then in place...
        while not stop.is_set():
            os.rename(staged, evil)
            os.rename(evil, staged)
            swaps[0] += 1

    swapper = threading.Thread(target=swap, daemon=True)
    resumes = Resumes(SweepState(0.0, [Device("cpu", 0)]), {}, root=root, shared=True, exists=checkpoint.exists_at)
    attempts = {
        "tree swapped in and out under /tmp": str(evil / "trial-3" / "step-4"),
        "a path that climbs out with ..": str(root / ".." / ".." / ".." / "tmp" / STUDY_FOLDER / "trial-3" / "step-4"),
        "the root through the attacker's link": str(link / "trial-3" / "step-4"),
    }
    accepted: dict[str, int] = collections.Counter()
    worker_passed: dict[str, int] = collections.Counter()
    reasons: dict[str, collections.Counter] = {kind: collections.Counter() for kind in attempts}
    started = time.monotonic()
    swapper.start()
    try:
        for attempt in range(args.attempts):
            for kind, path in attempts.items():
                if resumes.inherited(Retry(attempt, path)) is not None:
                    accepted[kind] += 1
                why = refusal(path, root)  # (the worker's check, just before it loads)
                if not why:
                    worker_passed[kind] += 1
                reasons[kind][why.split(":")[0].replace(str(base), "<base>")[:70]] += 1
    finally:
        stop.set()
        swapper.join()
    own = refusal(root / "trial-3" / "step-4", root)
    seconds = time.monotonic() - started
    print("| attempt | tries | accepted by the executor | passed the worker's check | refused because (most often) |")
    print("|---|---|---|---|---|")
    for kind in attempts:
        top = "; ".join(f"{reason} ({count})" for reason, count in reasons[kind].most_common(2))
        print(f"| {kind} | {args.attempts} | {accepted[kind]} | {worker_passed[kind]} | {top} |")
    print(f"\n{swaps[0]} swaps of the tree in {seconds:.1f} s; the sweep's own checkpoint: {own or 'accepted'}")
    bad = sum(accepted.values()) + sum(worker_passed.values())
    print("PASS: nothing outside the root was accepted" if bad == 0 and not own else f"FAIL: {bad} accepted")


if __name__ == "__main__":
    import logging

    logging.getLogger("optuna").setLevel(logging.ERROR)
    main()
