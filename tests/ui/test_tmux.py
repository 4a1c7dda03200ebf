"""The real ``hotspare`` command in a real terminal (tmux), driven by keys as a person would."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fleetbed import POLL_S
from test_app import fleet, reap_executors  # noqa: F401

HOTSPARE = Path(sys.executable).with_name("hotspare")
SESSION = "hotspare-test"


def tmux(*args: str) -> str:
    return subprocess.run(
        ["tmux", *args], capture_output=True, text=True, timeout=10, check=True
    ).stdout


def screen() -> str:
    return tmux("capture-pane", "-p", "-t", SESSION)


def until(predicate: Callable[[str], bool], timeout: float, what: str) -> str:
    deadline = time.monotonic() + timeout
    while True:
        shown = screen()
        if predicate(shown):
            return shown
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}; screen:\n{shown}")
        time.sleep(POLL_S)  # polling, bounded by the deadline above


@pytest.fixture
def session() -> Iterator[None]:
    assert shutil.which("tmux"), "tmux is needed (scripts/test installs it)"
    subprocess.run(["tmux", "kill-session", "-t", SESSION], capture_output=True, timeout=10)
    yield
    subprocess.run(["tmux", "kill-session", "-t", SESSION], capture_output=True, timeout=10)


def test_the_real_command_in_tmux_shows_the_fleet_and_answers_keys(
    tmp_path: Path, session: None
) -> None:
    inventory = fleet(tmp_path, steps=200_000)
    # COLUMNS/LINES from the environment would override the terminal's real size
    command = f"env -u COLUMNS -u LINES OMP_NUM_THREADS=1 {HOTSPARE} --inventory {inventory} --policy auto"
    tmux("new-session", "-d", "-s", SESSION, "-x", "120", "-y", "40", command)
    tmux("set-option", "-t", SESSION, "remain-on-exit", "on")
    shown = until(lambda s: "Fleet" in s and "r2" in s, 30, "the Fleet view")
    assert "policy auto" in shown
    until(
        lambda s: any(line.split()[:1] == ["a"] and "j" in line.split() for line in s.splitlines()),
        60,
        "job j on host a",
    )
    tmux("send-keys", "-t", SESSION, "2")
    until(lambda s: "Jobs" in s and "running" in s, 60, "j running in the Jobs view")
    tmux("send-keys", "-t", SESSION, "?")
    until(lambda s: "checkpoint now" in s and "Esc or ? closes" in s, 10, "the keys")
    tmux("send-keys", "-t", SESSION, "Escape")
    until(lambda s: "Esc or ? closes" not in s, 10, "help closed")
    tmux("send-keys", "-t", SESSION, "q")
    shown = until(lambda s: "executors keep training" in s, 20, "the quit note")
    assert "Traceback" not in shown
