"""A run's cgroup v2: made under the executor's own cgroup, killed whole with ``cgroup.kill``.

A cgroup holds every process a run starts, whatever session, process group or parent it moves
to (torchrun's workers start their own session; a double fork leaves its parent), and the
kernel kills all of them at once, forks in flight included. It is used where the host allows
it: a cgroup v2 hierarchy is mounted (unified, or the hybrid layout's ``unified``), this user
may make a folder under its own cgroup and move a process into it, and the kernel has
``cgroup.kill`` (5.14). Elsewhere the fence process alone contains the run (``fence.py``).

Standard library only: the fence imports this module.
"""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path

PREFIX = "hotspare-run-"
KILL_TIMEOUT_S = 10.0


def mount_point(mountinfo: str = "/proc/self/mountinfo") -> Path | None:
    """Where the cgroup v2 hierarchy is mounted (None: it is not)."""
    try:
        lines = Path(mountinfo).read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        left, _, right = line.partition(" - ")
        fields = left.split()
        if right.split()[:1] == ["cgroup2"] and len(fields) >= 5:
            return Path(fields[4])
    return None


def own(pid: int | str = "self") -> Path | None:
    """The cgroup v2 folder ``pid`` (this process by default) is in, or None."""
    mount = mount_point()
    if mount is None:
        return None
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith("0::"):
            path = (mount / line[3:].lstrip("/")).resolve()
            return path if path.is_dir() else None
    return None


def usable(parent: Path | None = None) -> str | None:
    """Why runs cannot get a cgroup under ``parent`` (this process's own cgroup by default);
    None when they can."""
    parent = parent if parent is not None else own()
    if parent is None:
        return "no cgroup v2 hierarchy is mounted"
    if not (parent / "cgroup.kill").exists() and parent != mount_point():
        return "the kernel has no cgroup.kill (Linux 5.14 or later)"
    if not os.access(parent, os.W_OK):
        return f"{parent} is not writable by this user (no delegated cgroup)"
    return None


def make(name: str, parent: Path | None = None) -> Path | None:
    """A new cgroup ``parent/name`` that has ``cgroup.kill``; None where the host gives none."""
    parent = parent if parent is not None else own()
    if parent is None or usable(parent) is not None:
        return None
    path = parent / name
    try:
        path.mkdir()
    except FileExistsError:
        pass
    except OSError:
        return None
    if not (path / "cgroup.kill").exists():
        remove(path)
        return None
    return path


def join(path: Path, pid: int = 0) -> None:
    """Move ``pid`` (0: the calling process) into the cgroup; OSError if the kernel refuses."""
    fd = os.open(path / "cgroup.procs", os.O_WRONLY)
    try:
        os.write(fd, str(pid).encode())
    finally:
        os.close(fd)


def procs(path: Path) -> list[int]:
    """The processes in the cgroup and every cgroup under it ([] once it is gone)."""
    found: list[int] = []
    try:
        for here, _dirs, files in os.walk(path):
            if "cgroup.procs" in files:
                with open(os.path.join(here, "cgroup.procs")) as f:
                    found.extend(int(x) for x in f.read().split())
    except (OSError, ValueError):
        pass
    return found


def populated(path: Path) -> bool:
    """Does any process live in the cgroup or under it? (False once it is gone.)"""
    try:
        for line in (path / "cgroup.events").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "populated":
                return value.strip() == "1"
    except OSError:
        return False
    return bool(procs(path))


def kill(path: Path) -> None:
    """SIGKILL every process in the cgroup and under it, at once (a gone cgroup: nothing)."""
    try:
        fd = os.open(path / "cgroup.kill", os.O_WRONLY)
    except FileNotFoundError:
        return
    try:
        os.write(fd, b"1")
    except OSError as e:  # removed between the open and the write (its run ended): gone too
        if e.errno not in (errno.ENODEV, errno.ENOENT):
            raise
    finally:
        os.close(fd)


def remove(path: Path) -> None:
    """Remove an empty cgroup and the empty ones under it (what is not empty stays)."""
    for here, dirs, _files in os.walk(path, topdown=False):
        for d in dirs:
            try:
                os.rmdir(os.path.join(here, d))
            except OSError:
                pass
    try:
        os.rmdir(path)
    except OSError:
        pass


def kill_and_wait(path: Path, timeout_s: float = KILL_TIMEOUT_S) -> bool:
    """Kill the cgroup, wait until it is empty and remove it; False if something outlived the
    deadline (stuck in the kernel), the cgroup kept."""
    deadline = time.monotonic() + timeout_s
    kill(path)
    while populated(path):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    remove(path)
    return True
