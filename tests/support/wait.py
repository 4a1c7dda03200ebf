"""Waiting on a condition with a deadline: the one polling helper of the tests, in its blocking
(``wait_for``) and its asyncio form (``until``, the event loop running meanwhile, or a pause of
the caller's own, such as a Textual pilot's), and a file lock another process of the run may hold
(``flocked``). Never a sleep as synchronisation: the predicate is asked until it holds, and the
test fails naming ``what`` at the deadline, with ``detail``'s text (the last screen, say) after."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import inspect
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

POLL_S = 0.05


class _Deadline:
    def __init__(
        self, timeout: float, what: str | Callable[[], str], detail: Callable[[], str] | None
    ) -> None:
        self._at = time.monotonic() + timeout
        self._timeout = timeout
        self._what = what
        self._detail = detail

    def check(self) -> None:
        if time.monotonic() > self._at:
            what = self._what() if callable(self._what) else self._what
            said = f"timed out after {self._timeout}s waiting for {what}"
            raise AssertionError(f"{said}; {self._detail()}" if self._detail else said)


def wait_for(
    predicate: Callable[[], Any],
    timeout: float,
    what: str | Callable[[], str],
    interval: float = POLL_S,
    detail: Callable[[], str] | None = None,
) -> Any:
    """Poll ``predicate`` until it is truthy (its value is returned); fail at the deadline.
    ``what`` (or what it returns, asked only then) names the wait; ``detail``'s text follows."""
    deadline = _Deadline(timeout, what, detail)
    while not (value := predicate()):
        deadline.check()
        time.sleep(interval)
    return value


async def until(
    predicate: Callable[[], Any],
    timeout: float,
    what: str | Callable[[], str],
    interval: float = POLL_S,
    detail: Callable[[], str] | None = None,
    pause: Callable[[float], Awaitable[Any]] | None = None,
) -> Any:
    """``wait_for`` for a test on the event loop: the loop keeps running meanwhile. A predicate
    may be async (what it returns is awaited); ``pause`` (``asyncio.sleep`` unless given, a
    Textual ``pilot.pause`` to let the app run) waits out each ``interval``."""
    deadline = _Deadline(timeout, what, detail)
    wait_out: Callable[[float], Awaitable[Any]] = asyncio.sleep if pause is None else pause
    while not (value := await _value(predicate())):
        deadline.check()
        await wait_out(interval)
    return value


async def _value(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


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
