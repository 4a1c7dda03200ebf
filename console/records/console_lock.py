"""One console per state dir: an exclusive lock held for the console's life.

Two consoles on one state dir would each hand out epochs and each fail jobs over: the split
brain the leases exist to prevent. The kernel drops the lock when the console dies, however
it dies, so a stale lock never needs clearing by hand.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path

from protocol.errors import ConfigError

LOCK_NAME = "console.lock"


class StateDirBusy(ConfigError):
    """Another live console holds this state dir."""


class ConsoleLock:
    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock and write who holds it; ``StateDirBusy`` names the holder if taken."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StateDirBusy(
                f"{self.path.parent}: another console holds this state dir ({holder(self.path)}); "
                "`hotspare --read-only` can watch beside it"
            ) from None
        os.set_inheritable(fd, False)
        me = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(me).encode() + b"\n", 0)
        self._fd = fd

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


def held(state_dir: Path) -> bool:
    """Whether a live console (or controller) holds ``state_dir`` now: the kernel's word."""
    path = state_dir / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # drops the probe's own lock, if it got one
    return False


def holder(path: Path) -> str:
    """The holder as one phrase: 'pid 4242 on gpu-console since 2026-12-01 03:41:07'."""
    try:
        info = json.loads(path.read_text())
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(info["since"])))
        return f"pid {int(info['pid'])} on {info['host']} since {since}"
    except (OSError, ValueError, KeyError, TypeError):
        return "holder unknown"
