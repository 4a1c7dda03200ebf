"""The controllers' term: a fencing token that only rises, so a deposed leader orders nothing.

With standby controllers (``[console] etcd``) each leader is elected under a term that rises
on every election (the revision at which it took the etcd leader key). A controller says its
term in the Hello of every link it opens; the executor keeps the highest term it has seen,
in its workdir too (an executor started later in that workdir starts from it), and refuses
every order (Start, Lease, Stop, Drain, CheckpointNow) that comes on a link of a lower term:
a leader that slept through its term (SIGSTOP, a cut link, a clock step) and wakes up cannot
renew, stop or move anything. Without etcd every controller's term is 0 and nothing is refused.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from executors.durable import atomic_write

TERM = "term"
"""The workdir's file with the highest term seen."""


class TermFence:
    def __init__(self, workdir: Path) -> None:
        self._path = workdir / TERM
        self.seen = 0
        with contextlib.suppress(OSError, ValueError):
            self.seen = int(self._path.read_text().strip())

    def hello(self, term: int) -> None:
        """A link opened under ``term``: the highest seen rises to it (kept on disk first)."""
        if term > self.seen:
            with contextlib.suppress(OSError):  # a full disk: still fenced in this process
                atomic_write(self._path, f"{term}\n".encode())
            self.seen = term

    def refusal(self, term: int, order: str) -> str | None:
        """Why an order on a link of ``term`` is refused; None: it is obeyed."""
        if term >= self.seen:
            return None
        return (
            f"{order} refused: it came from a controller of term {term}, and term {self.seen} "
            "has been seen (a deposed leader)"
        )
