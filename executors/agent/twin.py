"""The warm twin's seat: an idle executor beside a job's executor on the same host, which becomes
that job's executor the moment the executor's process is gone (SIGKILL, a segfault, the OOM
killer), so a restart in place costs a Start, not a process start and ``import torch``.

A twin serves ``twin.sock`` and records ``twin.pid``; it holds ``twin.lock`` (one twin per
workdir) but not the workdir's executor lock. On Start it takes that lock without waiting: if
the executor still holds it, the Start is refused (never two trainers of one job); once taken,
the twin is exactly an executor: ``executor.pid``, ``executor.sock`` served too, and the twin's
own files let go of, so the console can start the next twin. While a twin, it writes its events
to ``twin-events.jsonl``: the executor's ``events.jsonl`` tells how the executor ended.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from executors.agent.workdir import WorkdirBusy, acquire, hold, reap_command
from executors.durable import atomic_write
from protocol.errors import ConfigError
from protocol.workdirs import MAX_SOCKET_PATH, TWIN_SOCKET, staged

TWIN_PID = "twin.pid"
TWIN_LOCK = "twin.lock"
TWIN_EVENTS = "twin-events.jsonl"
TWIN_WARM = "twin.warm"
"""Written once the twin has torch imported and warmed up (what a benchmark waits for)."""


class TwinBusy(WorkdirBusy):
    """Another twin already waits on this workdir; one is enough."""


def listen(path: Path) -> socket.socket:
    """A listening Unix socket at ``path``, mode 0600 from its first moment (any file there is
    stale: the caller holds the lock that goes with it). It is bound under a hidden name and
    renamed into place once listening, so a client that sees ``path`` is never refused (a
    fresh-clone run connected between bind and listen: ``ConnectionRefusedError``)."""
    staged_at = path.with_name(staged(path.name))
    size = len(bytes(staged_at))
    if size > MAX_SOCKET_PATH:
        raise ConfigError(
            f"{staged_at}: socket path of {size} bytes, more than a Unix socket's "
            f"{MAX_SOCKET_PATH}; use a shorter workdir"
        )
    staged_at.unlink(missing_ok=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        sock.bind(str(staged_at))
    finally:
        os.umask(old)
    os.chmod(staged_at, 0o600)
    sock.listen(64)
    sock.setblocking(False)
    os.replace(staged_at, path)
    return sock


class TwinSeat:
    """The twin's hold on its workdir, from ``take`` until ``promote`` or ``leave``."""

    def __init__(self, workdir: Path, fd: int) -> None:
        self.workdir = workdir
        self._fd: int | None = fd

    @classmethod
    def take(cls, workdir: Path) -> TwinSeat:
        """Hold ``twin.lock`` for this process's life and record ``twin.pid``; TwinBusy if
        another twin holds it."""
        fd = hold(
            workdir,
            TWIN_LOCK,
            TWIN_PID,
            lambda holder: TwinBusy(
                f"{workdir}: a warm twin (pid {holder}) already waits here; one twin per job "
                "and host"
            ),
        )
        (workdir / TWIN_WARM).unlink(missing_ok=True)
        return cls(workdir, fd)

    def warmed(self) -> None:
        if self._fd is not None:
            atomic_write(self.workdir / TWIN_WARM, f"{os.getpid()}\n".encode())

    def promote(self) -> int:
        """Take the workdir's executor lock without waiting (WorkdirBusy while the executor
        lives: the Start is refused) and reap what a killed ``command`` executor left running.

        Returns the lock's descriptor, held for the process's life; ``executor.pid`` names
        this process from then on.
        """
        fd = acquire(self.workdir)
        try:
            reap_command(self.workdir)
        except WorkdirBusy:
            (self.workdir / "executor.pid").unlink(missing_ok=True)
            os.close(fd)
            raise
        return fd

    def leave(self) -> None:
        """Let go of the twin's files and lock (promoted, or exiting as a twin)."""
        if self._fd is None:
            return
        for name in (TWIN_SOCKET, TWIN_WARM, TWIN_PID):
            (self.workdir / name).unlink(missing_ok=True)
        os.close(self._fd)
        self._fd = None
