"""A job's folder on a host: the names of what lives there, and the lock that keeps it to one executor."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

SOCKET = "executor.sock"
PID = "executor.pid"
LOCK = "executor.lock"
EVENTS = "events.jsonl"
CRASH = "crash.log"
CHECKPOINTS = "checkpoints"
MAX_SOCKET_PATH = 107


class WorkdirBusy(Exception):
    """Another live executor holds the workdir; starting a second would be a split brain."""


def acquire(workdir: Path) -> int:
    """Hold the workdir's lock for this process's life (the kernel drops it, even on SIGKILL)."""
    workdir.mkdir(parents=True, exist_ok=True)
    fd = os.open(workdir / LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        try:
            holder = (workdir / PID).read_text().strip()
        except OSError:
            holder = "unknown"
        raise WorkdirBusy(
            f"{workdir}: another executor (pid {holder}) is already running here"
        ) from None
    os.set_inheritable(fd, False)
    return fd
