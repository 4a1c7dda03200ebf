"""Waiting on a condition with a deadline: the one polling helper of the tests, in its blocking
(``wait_for``) and its asyncio form (``until``, the event loop running meanwhile). Never a sleep
as synchronisation: the predicate is asked until it holds, and the test fails naming ``what``
at the deadline."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
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
