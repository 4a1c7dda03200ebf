"""The real ``hotspare`` command in a real terminal: tmux driven as a person types, ``hotspare
stop`` as an operator runs it, and which process holds a state dir's console lock."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HOTSPARE = Path(sys.executable).with_name("hotspare")


def tmux(*args: str) -> str:
    return subprocess.run(
        ["tmux", *args], capture_output=True, text=True, timeout=10, check=True
    ).stdout


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
