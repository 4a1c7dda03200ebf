"""Where executor events go when it runs by hand: JSON lines, a progress bar, the workdir's log."""

from __future__ import annotations

import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

import msgspec

from executors.agent.workdir import CRASH
from protocol.faults import FaultKind
from protocol.messages import (
    CheckpointSaved,
    ExecutorMessage,
    Fault,
    Finished,
    Log,
    Progress,
    Resumed,
    Stopped,
)

_json = msgspec.json.Encoder()


def to_json(msg: ExecutorMessage) -> bytes:
    return _json.encode(msg)


class JsonLines:
    """One JSON object per line per event, flushed at once (``--json``)."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._lock = threading.Lock()

    def __call__(self, msg: ExecutorMessage) -> None:
        line = to_json(msg).decode()
        with self._lock:
            self._stream.write(line + "\n")
            self._stream.flush()


class EventLog:
    """The executor's own append-only record in its workdir (``events.jsonl``)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(path, "ab", buffering=0)  # noqa: SIM115 - lives as long as the executor
        self._lock = threading.Lock()

    def __call__(self, msg: ExecutorMessage) -> None:
        with self._lock:
            self._f.write(to_json(msg) + b"\n")

    def close(self) -> None:
        self._f.close()


def _duration(s: float | None) -> str:
    if s is None or s != s:
        return "--:--"
    s = int(s)
    return (
        f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"
        if s >= 3600
        else f"{s // 60:02d}:{s % 60:02d}"
    )


class ProgressBar:
    """A one-line bar with step, loss, steps/s and ETA; other events print above it."""

    def __init__(self, stream: TextIO = sys.stderr, width: int = 28) -> None:
        self._stream = stream
        self._tty = stream.isatty()
        self._width = width
        self._lock = threading.Lock()
        self._last_plain = 0.0

    def __call__(self, msg: ExecutorMessage) -> None:
        with self._lock:
            if isinstance(msg, Progress):
                self._bar(msg)
            else:
                line = self._line(msg)
                if line:
                    self._stream.write(("\r\x1b[K" if self._tty else "") + line + "\n")
                    self._stream.flush()

    def _bar(self, p: Progress) -> None:
        frac = p.step / p.steps if p.steps else 1.0
        filled = int(frac * self._width)
        text = (
            f"[{'#' * filled}{'.' * (self._width - filled)}] step {p.step}/{p.steps}  "
            f"loss {p.loss:.4f}  {p.steps_per_s:.1f} steps/s  ETA {_duration(p.eta_s)}"
        )
        if self._tty:
            self._stream.write("\r\x1b[K" + text)
        elif time.monotonic() - self._last_plain >= 5 or p.step == p.steps:
            self._last_plain = time.monotonic()
            self._stream.write(text + "\n")
        self._stream.flush()

    @staticmethod
    def _line(msg: ExecutorMessage) -> str | None:
        if isinstance(msg, CheckpointSaved):
            m = msg.manifest
            return f"checkpoint step {m.step}: {m.size / 1e6:.1f} MB in {msg.write_s:.2f}s (stall {msg.stall_s * 1e3:.0f} ms)"
        if isinstance(msg, Resumed):
            return (
                f"resumed at step {msg.step} from {msg.checkpoint}"
                if msg.checkpoint
                else "starting at step 0"
            )
        if isinstance(msg, Fault):
            return f"fault {msg.fault}: {msg.message}"
        if isinstance(msg, Log):
            return f"{msg.level}: {msg.text}"
        if isinstance(msg, Stopped):
            return f"stopped at step {msg.step} ({msg.reason}); resumable from step {msg.checkpoint_step}"
        if isinstance(msg, Finished):
            return f"finished at step {msg.step}; params sha256 {msg.params_sha256}"
        return None


def report_crash(e: BaseException, workdir: Path, emit: Callable[[ExecutorMessage], None]) -> int:
    """A workload crash: one line as an event and on stderr; the traceback goes to the workdir's crash.log."""
    from executors.exitcodes import FAILED

    with open(workdir / CRASH, "a") as f:
        traceback.print_exception(e, file=f)
    line = (f"{type(e).__name__}: {e}".splitlines() or [type(e).__name__])[0]
    emit(Fault(fault=FaultKind.CRASH, message=line, fatal=True))
    print(f"hotspare-executor: crashed: {line} (traceback in {workdir / CRASH})", file=sys.stderr)
    return FAILED
