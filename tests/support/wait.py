"""Waiting on a condition with a deadline: the one polling helper of the tests, in its blocking
(``wait_for``) and its asyncio form (``until``, the event loop running meanwhile), and a file
lock another process of the run may hold (``flocked``). Never a sleep
as synchronisation: the predicate is asked until it holds, and the test fails naming ``what``
at the deadline."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

POLL_S = 0.05


class _Deadline:
    def __init__(self, timeout: float, what: str) -> None:
        self._at = time.monotonic() + timeout
        self._timeout = timeout
        self._what = what

    def check(self) -> None:
        if time.monotonic() > self._at:
            raise AssertionError(f"timed out after {self._timeout}s waiting for {self._what}")


def wait_for(
    predicate: Callable[[], Any], timeout: float, what: str, interval: float = POLL_S
) -> Any:
    """Poll ``predicate`` until it is truthy (its value is returned); fail at the deadline."""
    deadline = _Deadline(timeout, what)
    while not (value := predicate()):
        deadline.check()
        time.sleep(interval)
    return value


async def until(
    predicate: Callable[[], Any], timeout: float, what: str, interval: float = POLL_S
) -> Any:
    """``wait_for`` for a test on the event loop: the loop keeps running meanwhile."""
    deadline = _Deadline(timeout, what)
    while not (value := predicate()):
        deadline.check()
        await asyncio.sleep(interval)
    return value


@contextlib.contextmanager
def flocked(path: Path, timeout: float, interval: float = 0.01) -> Iterator[None]:
    """``path`` locked (``flock``) by this process alone while the block runs; another process
    of the run holding it is waited for, and the test fails at the deadline naming it."""
    with path.open("a") as f:
        wait_for(lambda: _took(f), timeout, f"{path}, held by another process", interval)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _took(f: Any) -> bool:
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True
