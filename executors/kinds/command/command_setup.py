"""The command kind's ``setup``: an argv run before the command's first start on a host.

What it ran is recorded in ``WORKDIR/setup.done`` (the sha256 of its argv, its environment but
for the per-run variables, and its cwd), so a later run, a restart in place or the next
executor on the host skips it, and a change to any of those runs it again. One setup at a time
per workdir: a run that starts while a ``Prepare`` runs setup waits for it and then finds it
done. It runs in its own session (stdin ``/dev/null``, output logged line by line as ``setup:
...``), never through a shell; past its timeout, or when the executor is told to stop, its
process group (its recorded pgid: it leads it) is SIGKILLed. A process it leaves behind after
an executor was SIGKILLed mid-setup is not fenced: setup trains nothing.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shlex
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

from executors.agent.workdir import TOKEN_ENV
from executors.durable import atomic_write
from executors.fencing.publish import Emit
from executors.kinds.command.command_io import start_reader
from protocol.errors import HotspareError
from protocol.messages import Log, LogLevel

DONE = "setup.done"
POLL_S = 0.1
TAIL_LINES = 5
_guard = threading.Lock()
_locks: dict[Path, threading.Lock] = {}


class SetupFailed(HotspareError):
    """Setup did not complete (a sentence: how it ended, and its last output lines)."""

    permanent = True


def digest(argv: list[str], env: dict[str, str], cwd: Path, per_run: set[str]) -> str:
    fixed = sorted((k, v) for k, v in env.items() if k not in per_run and k != TOKEN_ENV)
    text = json.dumps({"argv": argv, "env": fixed, "cwd": str(cwd)}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def _lock(workdir: Path) -> threading.Lock:
    with _guard:
        return _locks.setdefault(workdir, threading.Lock())


def ensure(
    workdir: Path,
    argv: list[str],
    env: dict[str, str],
    cwd: Path,
    *,
    per_run: set[str],
    timeout_s: float,
    emit: Emit,
    stopped: Callable[[], bool],
) -> None:
    """Run ``argv`` unless ``WORKDIR/setup.done`` says it ran as it is now; SetupFailed if
    it fails, times out or is stopped (nothing is recorded then)."""
    with _lock(workdir):
        want = digest(argv, env, cwd, per_run)
        done = workdir / DONE
        with contextlib.suppress(OSError):
            if done.read_text().strip() == want:
                return
        done.unlink(missing_ok=True)
        emit(Log(level=LogLevel.INFO, text=f"setup: running {shlex.join(argv)} (in {cwd})"))
        t0 = time.monotonic()
        tail: deque[str] = deque(maxlen=TAIL_LINES)
        how = _run(argv, env, cwd, timeout_s, emit, stopped, tail)
        took = time.monotonic() - t0
        if how is not None:
            last = " | ".join(tail) or "(no output)"
            raise SetupFailed(f"setup {how} after {took:.1f}s: {shlex.join(argv)}; output: {last}")
        atomic_write(done, f"{want}\n".encode())
        emit(Log(level=LogLevel.INFO, text=f"setup: done in {took:.1f}s"))


def _run(
    argv: list[str],
    env: dict[str, str],
    cwd: Path,
    timeout_s: float,
    emit: Emit,
    stopped: Callable[[], bool],
    tail: deque[str],
) -> str | None:
    """None when it exited 0; else how it ended (past ``timeout_s`` or stopped: its group
    killed)."""

    def line(text: str) -> None:
        tail.append(text[:200])
        emit(Log(level=LogLevel.INFO, text=f"setup: {text}"))

    try:
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    except OSError as e:
        return f"could not start ({type(e).__name__}: {e})"
    assert proc.stdout is not None
    reader = start_reader("hotspare-setup", proc.stdout, line)
    deadline = time.monotonic() + timeout_s
    how: str | None = None
    while True:
        with contextlib.suppress(subprocess.TimeoutExpired):
            code = proc.wait(timeout=POLL_S)
            if code < 0:
                how = f"was killed by {signal.Signals(-code).name}"
            elif code > 0:
                how = f"exited with code {code}"
            break
        if stopped() or time.monotonic() > deadline:
            how = "was stopped" if stopped() else f"did not end within {timeout_s:g}s"
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # its own group: it leads it
            proc.wait(timeout=10)
            break
    reader.join(timeout=2)
    return how
