"""The real ``hotspare`` command in a real terminal: tmux driven as a person types, its screen
waited on, ``hotspare stop`` as an operator runs it, and which process holds a state dir's
console lock."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from support.fleetbed import EXECUTOR_ENV
from support.wait import POLL_S, wait_for

HOTSPARE = Path(sys.executable).with_name("hotspare")

PACED = json.dumps({h: EXECUTOR_ENV for h in ("a", "b", "c")})
"""The executors' environment on the beds' hosts (``HOTSPARE_EXECUTOR_ENV``): paced, as the
in-process consoles' are. Unpaced, the one executor of a view test trained at a whole core
for the test's half minute (69 CPU s of the suite's heaviest UI test)."""


def paced_env() -> dict[str, str]:
    """The environment of a ``hotspare`` started by a test as a subprocess."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "HOTSPARE_EXECUTOR_ENV": PACED}


def view_command(inventory: Path, *extra: str) -> str:
    """The shell line tmux runs for a view: COLUMNS/LINES from the environment would override
    the terminal's real size; the executors it starts are paced."""
    words = [str(HOTSPARE), "--inventory", str(inventory), *extra]
    return (
        f"env -u COLUMNS -u LINES OMP_NUM_THREADS=1 HOTSPARE_EXECUTOR_ENV={shlex.quote(PACED)} "
        + shlex.join(words)
    )


def tmux(*args: str) -> str:
    return subprocess.run(
        ["tmux", *args], capture_output=True, text=True, timeout=10, check=True
    ).stdout


def until_shown(
    session: str,
    predicate: Callable[[str], Any],
    timeout: float,
    what: str | Callable[[], str],
    interval: float = POLL_S,
) -> str:
    """Until ``predicate`` holds of ``session``'s screen, which is returned; at the deadline the
    test fails naming ``what`` (or what it returns, asked then) and showing the last screen."""
    shown = ""

    def holds() -> bool:
        nonlocal shown
        shown = tmux("capture-pane", "-p", "-t", session)
        return bool(predicate(shown))

    wait_for(holds, timeout, what, interval, detail=lambda: f"screen:\n{shown}")
    return shown


def stop_controller(inventory: Path) -> str:
    """``hotspare stop``, as an operator types it; its one line."""
    done = subprocess.run(
        [str(HOTSPARE), "--inventory", str(inventory), "stop"],
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert done.returncode == 0, done.stderr
    return done.stderr


def lock_holder(state_dir: Path) -> int | None:
    """The pid holding the flock on the state dir's console.lock, from /proc/locks."""
    st = (state_dir / "console.lock").stat()
    want = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    for line in Path("/proc/locks").read_text().splitlines():
        words = line.split()
        if "FLOCK" in words and want in words:
            return int(words[words.index("FLOCK") + 3])
    return None
