"""Fixtures of the controller-service tests."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def reap(tmp_path: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Whatever the test started (a supervisor loop, controllers, executors) is killed after."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError, ValueError):
            args = cmdline.read_bytes().split(b"\0")
            if any(str(tmp_path).encode() in a for a in args):
                os.kill(int(cmdline.parent.name), signal.SIGKILL)
