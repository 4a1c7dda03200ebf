"""How a chaos run ends early: SIGTERM, SIGHUP or SIGINT (a timeout, a closed terminal,
Ctrl-C) raise SystemExit in the main thread, so each episode's ``finally`` takes its fleet
down (console, sshd hosts and all under them, namespaces, tmpfs mounts). While a fleet is
being built, half-made parts are not yet where its ``close`` finds them: the signal waits
for the build to end, then ends the run."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from types import FrameType

SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)
_held = 0
_pending: int | None = None


def install() -> None:
    for sig in SIGNALS:
        signal.signal(sig, _ended_by)


def _ended_by(signum: int, _frame: FrameType | None) -> None:
    global _pending
    for sig in SIGNALS:
        signal.signal(sig, signal.SIG_IGN)  # the teardown runs to its end
    _pending = signum
    if not _held:
        raise SystemExit(128 + signum)


@contextlib.contextmanager
def held() -> Iterator[None]:
    """A signal that comes meanwhile waits for the block to end (``end_if_asked``)."""
    global _held
    _held += 1
    try:
        yield
    finally:
        _held -= 1


def end_if_asked() -> None:
    """Raise the SystemExit a signal held by ``held`` asked for, if one came."""
    if _pending is not None and not _held:
        raise SystemExit(128 + _pending)


def asked() -> bool:
    """Whether a signal asked the run to end: its checks are skipped, its folder not kept."""
    return _pending is not None
