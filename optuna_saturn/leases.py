"""Devices leased per machine: two sweeps on one machine (two users, two studies, two notebooks) never run on one
device at once.

Why: nothing else stops a second ``SaturnExecutor`` on the same host from running on the GPUs the first one holds.
Each sweep's trials then run out of memory because of the other's, and the planner learns false limits. This is
Optuna's own way to scale (several processes on one storage), and how a lab shares one server.

How: one lock file per physical device in a folder every user of the machine can reach
(``/tmp/optuna-saturn-leases``, sticky and world-writable like ``/tmp`` itself, whatever ``TMPDIR`` says;
``OPTUNA_SATURN_LEASES`` names another, or ``off``). A GPU is named by its UUID (two sweeps with different
``CUDA_VISIBLE_DEVICES`` number their GPUs alike, and one GPU differently), a CPU device by each of its cores
(two sweeps that split the cores differently still meet on the cores they share). A sweep takes all its
devices' locks at once or none (two sweeps that each took half would wait for each other for ever), holds an
exclusive ``flock`` on them for as long as it runs, and writes who it is into the files (user, pid, study).
The kernel releases a lock when its process dies, however it dies, so a crashed holder's lease ends with it. A
sweep whose devices another holds waits for them, saying who holds them, and starts once they are free.
``optuna-saturn devices`` shows who holds what. A Ray sweep leases its devices the same way, on each node: each
device's actor takes its device's lease on its node before it touches the device (Ray's own resources keep two Ray
sweeps apart, not a Ray sweep and a local one on the node), and holds it while it lives
(:mod:`optuna_saturn.pools.ray_lease`).
"""

from __future__ import annotations

import contextlib
import fcntl
import getpass
import json
import os
import stat
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from optuna_saturn import nvml
from optuna_saturn.devices import Device

#: Names the folder of the lease files, or turns leasing off ("off").
LEASES_ENV = "OPTUNA_SATURN_LEASES"
#: How often a waiting sweep tries its devices again.
POLL_SECONDS = 0.5
#: The descriptors of the leases this process holds. A forked child (the pool host, its workers) closes its copies
#: at once: a lock lives while any copy of its descriptor is open, and a sweep killed with ``kill -9`` must free
#: its devices then, not when its last worker notices. (Spawned programs never get them: they are close-on-exec.)
_HELD: set[int] = set()


def _close_inherited() -> None:
    for descriptor in _HELD:
        with contextlib.suppress(OSError):
            os.close(descriptor)
    _HELD.clear()


os.register_at_fork(after_in_child=_close_inherited)


def leases_folder() -> Path | None:
    """Where this machine's leases are (None: leasing is off)."""
    configured = os.environ.get(LEASES_ENV, "")
    if configured.lower() in ("off", "0", "false", "no"):
        return None
    return Path(configured) if configured else Path("/tmp/optuna-saturn-leases")  # (not TMPDIR: per user, per job)


def lease_names(device: Device) -> list[str]:
    """The lease files of ``device``: names every sweep on the machine gives the same hardware."""
    if device.kind == "cuda":
        visible = [e.strip() for e in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if e.strip()]
        entry = visible[device.index] if device.index < len(visible) else str(device.index)
        return [gpu_lease_name(entry)]
    if device.kind == "cpu" and device.cores:
        return [f"cpu-core-{core}.lease" for core in device.cores]
    return [f"{device.kind}-{device.index}.lease"]


def gpu_lease_name(entry: str) -> str:
    """The lease file of the GPU a ``CUDA_VISIBLE_DEVICES`` entry names: by its UUID, which every mask agrees on."""
    return f"cuda-{nvml.uuid_of(entry) or entry}.lease"


@dataclass(frozen=True)
class Holder:
    """Who holds a device: as the holding sweep wrote it into the lease file."""

    user: str
    pid: int
    study: str
    since: float
    ray_sweep: str = ""  # a Ray sweep's actor holds it: that sweep's id (its actors on one machine share leases)
    device: str = ""  # and the actor's device, as the Ray sweep names it
    pool: str = "Ray"  # the kind of pool whose worker holds it, where ``ray_sweep`` is set (a SLURM node's host too)

    def describe(self) -> str:
        held = time.strftime("%H:%M:%S", time.localtime(self.since))
        if self.ray_sweep:
            return (
                f"{self.user}'s {self.pool} sweep of study {self.study!r} (its worker of {self.device}, "
                f"pid {self.pid}, since {held})"
            )
        return f"{self.user}'s sweep of study {self.study!r} (pid {self.pid}, since {held})"


class DeviceLeases:
    """The leases one sweep takes on its devices (see the module's docstring)."""

    def __init__(
        self,
        devices: Sequence[Device],
        *,
        folder: Path,
        study: str,
        names: Callable[[Device], list[str]] = lease_names,
        about: dict[str, str] | None = None,
        shares_with: Callable[[Holder], bool] | None = None,
    ) -> None:
        """``names``: each device's lease files (a Ray actor knows its GPU otherwise than by its index); ``about``:
        what the holder adds to its lease files; ``shares_with``: holders whose leases count as this one's (a
        Ray sweep's actors of two Ray nodes on one machine: one sweep, which splits its machine as it was told)."""
        self._devices = list(devices)
        self._folder = folder
        self._study = study
        self._names = names
        self._about = about or {}
        self._shares_with = shares_with
        self._held: dict[str, int] = {}  # lease name -> the open, locked file's descriptor

    def take_free(self) -> list[Device]:
        """Lease every device, all or none: returns the devices someone else holds (then none is held)."""
        with _said_where(self._folder):
            shared_folder(self._folder)
        missing = [
            device
            for device in self._devices
            if not all(name in self._held or self._take(name) or self._shared(name) for name in self._names(device))
        ]
        if missing:
            self.release()  # (holding some while waiting for the rest could wait for ever, on a sweep doing the same)
        return missing

    def wait_for_all(self, *, deadline: float | None, say: Callable[[str], None]) -> bool:
        """Lease every device, waiting while others hold some (said once per change of who holds them); False if
        ``deadline`` (monotonic) passed first."""
        said = None
        while True:
            missing = self.take_free()
            if not missing:
                return True
            holders = read_holders(self._folder, missing, names=self._names)
            news = "; ".join(
                f"{device} by {holder.describe() if holder else 'another sweep'}" for device, holder in holders
            )
            if news != said:
                say(f"Waiting for devices another sweep on this machine holds: {news}.")
                said = news
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(POLL_SECONDS)

    def release(self) -> None:
        for descriptor in self._held.values():
            _HELD.discard(descriptor)
            os.close(descriptor)  # (which releases the lock)
        self._held.clear()

    def _take(self, name: str) -> bool:
        path = self._folder / name
        try:
            with _said_where(self._folder):
                descriptor = _open_lease(path)
        except PermissionError as exc:  # (another user's file, made private: no sweep can coordinate through it)
            raise RuntimeError(
                f"Cannot open the device lease {path} ({exc.strerror}): another user made it private. Remove it "
                f"(as its owner or root), or set {LEASES_ENV} to another folder or to off."
            ) from exc
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(descriptor)
            return False
        with contextlib.suppress(OSError):  # (0666 whatever the umask: the next holder may be another user)
            if os.fstat(descriptor).st_uid == os.getuid():
                os.fchmod(descriptor, 0o666)
        holder = {"user": _user(), "pid": os.getpid(), "study": self._study, "since": time.time(), **self._about}
        with contextlib.suppress(OSError):
            os.ftruncate(descriptor, 0)
            os.pwrite(descriptor, json.dumps(holder).encode(), 0)
        self._held[name] = descriptor
        _HELD.add(descriptor)
        return True

    def _shared(self, name: str) -> bool:
        """Whether ``name``, held by another, is held by a holder this one shares with."""
        if self._shares_with is None:
            return False
        holder = _holder(self._folder / name)
        return holder is not None and self._shares_with(holder)


@contextlib.contextmanager
def leased(
    devices: Sequence[Device], *, study: str, deadline: float | None, say: Callable[[str], None]
) -> Iterator[bool]:
    """Hold every device's lease while in the block (waiting for them first); yields False if ``deadline`` passed
    before they were all free (the sweep then runs nothing). With leasing off, yields True at once."""
    folder = leases_folder()
    if folder is None:
        yield True
        return
    leases = DeviceLeases(devices, folder=folder, study=study)
    try:
        yield leases.wait_for_all(deadline=deadline, say=say)
    finally:
        leases.release()


def shared_folder(folder: Path) -> None:
    """``folder``, made if missing, sticky and writable by every user (as ``/tmp``): each user's sweep creates
    its own lease files there, and none may remove another's."""
    try:
        folder.mkdir(mode=0o777)
        os.chmod(folder, 0o1777)
    except FileExistsError:
        info = folder.lstat()
        if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
            raise RuntimeError(f"{folder} (device leases) is not a folder; remove it, or set {LEASES_ENV}.") from None


def read_holders(
    folder: Path, devices: Sequence[Device], *, names: Callable[[Device], list[str]] = lease_names
) -> list[tuple[Device, Holder | None]]:
    """Who holds each of ``devices``, as their lease files say (None: unreadable, or not said)."""
    held = []
    for device in devices:
        holders = [_holder(folder / name) for name in names(device)]
        held.append((device, next((h for h in holders if h is not None), None)))
    return held


def _open_lease(path: Path) -> int:
    """A lease file's descriptor, opened to write; created 0666 if missing. An existing one is opened without
    ``O_CREAT``: in a sticky folder, ``fs.protected_regular`` refuses that to whoever does not own the file."""
    while True:
        try:
            return os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            _create_open_to_all(path)  # (or another sweep made it meanwhile: either way, open it now)


def _create_open_to_all(path: Path) -> None:
    """Make the lease file ``path`` 0666 whatever the umask, in one step: it is made and opened to all under a
    name of its own, then linked to ``path`` (which fails where another sweep made it first). A file made under
    the umask and opened to all only after its lock was left private by a creator killed in between, and locked
    every other user out of the device."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}")
    descriptor = os.open(temporary, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(descriptor, 0o666)
        with contextlib.suppress(FileExistsError):
            os.link(temporary, path)
    finally:
        os.close(descriptor)
        with contextlib.suppress(OSError):
            os.unlink(temporary)


@contextlib.contextmanager
def _said_where(folder: Path) -> Iterator[None]:
    """A lease folder that cannot take a file (no free inode, no free block, read-only) raised a bare ``OSError``
    naming neither the leases nor the way around them: said here, with both."""
    try:
        yield
    except PermissionError:
        raise
    except OSError as exc:
        raise RuntimeError(
            f"Cannot make a device lease in {folder} ({exc.strerror or exc}): its file system may be full or "
            f"read-only. Free space there, or set {LEASES_ENV} to another folder (or to off, to run without "
            "leases)."
        ) from exc


def current_leases(folder: Path | None = None) -> list[tuple[str, Holder | None]]:
    """The leases held now on this machine: each lease file's device and its holder. A file no one holds is
    skipped (its lock is free)."""
    folder = folder if folder is not None else leases_folder()
    if folder is None or not folder.is_dir():
        return []
    held = []
    for path in sorted(folder.glob("*.lease")):
        try:
            descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(descriptor, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:  # someone holds it
            held.append((path.stem, _holder(path)))
        finally:
            os.close(descriptor)
    return held


def _holder(path: Path) -> Holder | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8") or "null")
        return Holder(
            str(data["user"]),
            int(data["pid"]),
            str(data["study"]),
            float(data["since"]),
            str(data.get("ray_sweep", "")),
            str(data.get("device", "")),
            str(data.get("pool", "Ray")),
        )
    except (OSError, ValueError, TypeError, KeyError):
        return None


def _user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # (no name for this uid: a container's)
        return f"uid {os.getuid()}"
