"""Start a controller detached (as tmux starts its server), and wait until it answers.

``hotspare`` on a state dir no controller holds starts ``hotspare serve`` in a session of its
own, its output appended to ``controller.log`` in the state dir, so that closing the view (or
the terminal, or the SSH session the view ran in) leaves training alone.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from console.reach.transport.detach import detach_argv
from console.records.console_lock import held
from console.service.client import ControllerGone, Remote
from protocol.errors import ConfigError

LOG_NAME = "controller.log"
READY_S = 60.0
"""The most a detached controller may take to answer on its socket (imports, the inventory's
hosts dialled are not waited for)."""
POLL_S = 0.05
LOG_TAIL = 4000


def start_detached(inventory: Path, state_dir: Path, policy: str) -> dict[str, Any]:
    """Start ``hotspare serve`` on ``inventory``; its hello once it answers. A controller that
    ends before it answers (a busy state dir, an inventory error) is a ``ConfigError`` with
    the last line it wrote."""
    state_dir.mkdir(parents=True, exist_ok=True)
    log = state_dir / LOG_NAME
    start = log.stat().st_size if log.exists() else 0
    argv = [
        sys.executable,
        "-m",
        "console",
        "--inventory",
        str(inventory.resolve()),
        "--policy",
        policy,
        "serve",
    ]
    out = subprocess.run(
        detach_argv(argv, log_path=str(log), cwd=os.getcwd()),
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    pid = int(out.stdout.strip())
    remote = Remote(state_dir)
    deadline = time.monotonic() + READY_S
    try:
        while True:
            if _gone(pid):
                raise ConfigError(f"the controller exited before it answered: {_said(log, start)}")
            if held(state_dir):
                try:
                    hello = remote.hello()
                except ControllerGone:
                    hello = {}
                if hello.get("pid") == pid:
                    return hello
            if time.monotonic() > deadline:
                raise ConfigError(
                    f"the controller (pid {pid}) did not answer in {READY_S:g} s; see {log}"
                )
            time.sleep(POLL_S)
    finally:
        remote.close()


def _gone(pid: int) -> bool:
    """Ended (or a zombie: the detached controller is init's child, not ours)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def _said(log: Path, start: int) -> str:
    """The last line the controller wrote to its log since ``start``."""
    try:
        with log.open("rb") as f:
            f.seek(max(start, log.stat().st_size - LOG_TAIL))
            lines = f.read().decode(errors="replace").strip().splitlines()
    except OSError:
        lines = []
    return lines[-1].removeprefix("hotspare: ") if lines else f"nothing written (see {log})"


__all__ = ["LOG_NAME", "start_detached"]
