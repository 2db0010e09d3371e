"""Which checkpoint a worker may load, and folders for checkpoints that only their owner can change.

Why: loading a checkpoint unpickles (``torch.distributed.checkpoint``'s metadata, DeepSpeed's files), so a path
that anyone who can write a trial attribute chose would run their code in the workers. A checkpoint is loaded only
from ``<root>/trial-N/step-K``, ``root`` being this study's checkpoint folder of this sweep, every component
existing (resolved strictly, links followed, then compared), and every folder from the root down this user's,
not a link, and writable by nobody else; the root's parents must be changeable by no other user either (owned by
this user or root, or sticky, as ``/tmp``). The executor checks when it plans the resume, and the worker again just
before it loads (reliability review, findings 2 and 16). Checkpoint folders are created 0700, whatever the umask
(under umask 002 a sweep refused its own checkpoints: finding 9).
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path


def refusal(path: str | os.PathLike, root: str | os.PathLike, *, on_disk: bool = True) -> str:
    """Why the checkpoint at ``path`` must not be loaded; "" if it may (see the module's docstring).
    ``on_disk=False``: a simulated pool's checkpoint, on no disk: only where it says it is can be checked."""
    given = Path(path)
    if (
        not given.is_absolute()
        or ".." in given.parts
        or not re.fullmatch(r"trial-\d+", given.parent.name)
        or not re.fullmatch(r"step-\d+", given.name)
    ):
        return f"it is not a trial's checkpoint (<this study's checkpoint folder>/trial-N/step-K): {path}"
    # (as named, too: a path through someone's link to the root passes the check, then loads where the link points
    # by then; the root as the sweep spells it, or resolved, as a saved checkpoint records it)
    if given.parent.parent not in (Path(os.path.abspath(root)), Path(os.path.realpath(root))):
        return f"it is not a trial's checkpoint in this study's checkpoint folder {root}"
    if not on_disk:
        return ""
    try:
        real_root = Path(os.path.realpath(root, strict=True))
        real = Path(os.path.realpath(path, strict=True))
    except OSError as exc:
        return f"{exc.filename or path} does not exist"
    if real.parent.parent != real_root or (real.parent.name, real.name) != (given.parent.name, given.name):
        return f"it is not a trial's checkpoint in this study's checkpoint folder {real_root}"
    for folder in (real, real.parent, real_root):
        info = folder.lstat()
        if stat.S_ISLNK(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o022:
            return f"{folder} is a link, another user's, or writable by others"
    for above in real_root.parents:  # (another user who may rename what is in them could swap the root)
        info = above.stat()
        if info.st_uid not in (0, os.getuid()) or (info.st_mode & 0o022 and not info.st_mode & stat.S_ISVTX):
            return f"{above} may be changed by another user"
    return ""


def make_private_folders(folder: Path) -> None:
    """``folder`` and every missing folder above it, each 0700 whatever the umask."""
    missing = []
    for candidate in (folder, *folder.parents):
        if candidate.exists():
            break
        missing.append(candidate)
    for candidate in reversed(missing):
        try:
            candidate.mkdir(mode=0o700)
        except FileExistsError:  # (another rank, or a sweep beside this one, made it meanwhile)
            continue
        os.chmod(candidate, 0o700)


class CheckpointNotWritten(OSError):
    """A trial's checkpoint the disk refused (full, say): it ends that trial alone, FAIL with this reason, and the
    sweep goes on; it is the sweep's write, not an exception of the objective (issue 47, N2)."""

    def __init__(self, folder: str | os.PathLike, cause: OSError) -> None:
        super().__init__(
            cause.errno,
            f"this trial's checkpoint could not be written under {folder} ({cause}): is the disk full? Free space "
            "there, or give the executor a checkpoint_dir= on another disk",
        )
