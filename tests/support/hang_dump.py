"""A test about to hit pytest-timeout prints where its asyncio tasks wait.

pytest-timeout's dump shows threads, and a hung asyncio test's main thread is always in the
event loop's ``select``: it does not say which await never returned. Shortly before the
timeout, a timer thread prints every live task's stack (captured with the test's stderr,
shown in its failure report). Diagnostic only: it changes nothing a test does.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import Iterator

import pytest

BEFORE_TIMEOUT_S = 15.0


def _dump() -> None:
    tasks = [t for t in list(asyncio.tasks._all_tasks) if not t.done()]  # every loop's
    print(f"--- {len(tasks)} asyncio task(s) still pending ---", file=sys.stderr)
    for task in tasks:
        try:
            task.print_stack(file=sys.stderr)
        except Exception as e:  # racing the loop thread: best effort
            print(f"{task!r}: {e}", file=sys.stderr)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    marker = item.get_closest_marker("timeout")
    timeout = (
        float(marker.args[0])
        if marker and marker.args
        else float(item.config.getini("timeout") or 0)
    )
    timer = None
    if timeout > BEFORE_TIMEOUT_S:
        timer = threading.Timer(timeout - BEFORE_TIMEOUT_S, _dump)
        timer.daemon = True
        timer.start()
    try:
        yield
    finally:
        if timer is not None:
            timer.cancel()
