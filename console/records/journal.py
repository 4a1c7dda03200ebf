"""The append-only journal: every observation and decision, one JSON line each, in state_dir.

The TUI, the headless output and ``hotspare report`` all read these same events, and a
restarted console rebuilds its state from them.

A write that fails (a full disk) loses no event and tears no line: the bytes not written
are kept (``PENDING_MAX`` at most) and written first by the next record or ``flush``, so the
file stays whole lines in order; listeners are told of every event at once either way.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Collection, Iterator
from enum import StrEnum
from pathlib import Path
from typing import Any, BinaryIO

import msgspec

from console import clock


class Kind(StrEnum):
    CONSOLE = "console"
    """The console started or stopped (data: pid, policy)."""
    HOST_STATE = "host_state"
    JOB_STATE = "job_state"
    PLACEMENT = "placement"
    """A job's host and spares were chosen or changed."""
    EXECUTOR = "executor"
    """An executor started, reattached, or exited (data: pid, epoch, exit_code)."""
    PROGRESS = "progress"
    CHECKPOINT = "checkpoint"
    REPLICA = "replica"
    """A checkpoint was copied to a spare and verified there."""
    ROUTE = "route"
    """How replicas from a host to a spare travel (data.route: direct, host to host, or relay,
    through the console; data.why for a fall-back), or a job's copy keys were removed."""
    FAULT = "fault"
    """A fault an executor reported."""
    HEALTH = "health"
    """A health rule fired (severity WARN or FAIL)."""
    INCIDENT = "incident"
    """One step of an incident's timeline (data.phase: detected, decided, transfer_done,
    executor_up, loaded, first_step; ended: its job stopped or failed before it recovered;
    started: the job was started again, and the incident goes on)."""
    ALERT = "alert"
    ACTION = "action"
    """An operator's or a policy's action."""
    FINISHED = "finished"
    WARNING = "warning"
    """A warning an executor logged (a file it cannot take as a checkpoint, an order it
    refused, a fallback it took); data.level."""


class Event(msgspec.Struct, kw_only=True, omit_defaults=True):
    t: float
    kind: Kind
    host: str | None = None
    job: str | None = None
    incident: int | None = None
    msg: str = ""
    data: dict[str, Any] = {}


PENDING_MAX = 4 << 20
"""Bytes of events kept while the journal cannot be written; past it, events are counted and
left out (a line says how many once it can be written again)."""

_enc = msgspec.json.Encoder()
_dec = msgspec.json.Decoder(Event)

Listener = Callable[[Event], object]


class Journal:
    def __init__(self, path: Path, *, read_only: bool = False) -> None:
        self.path = path
        self._f: BinaryIO | None = None
        """None for a read-only console: it follows the file the owner writes (``catch_up``),
        and its own events reach neither the file nor its listeners."""
        self._read_at = 0
        """Where a follower has read the owner's file up to (complete lines)."""
        if not read_only:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._f = open(path, "ab", buffering=0)  # noqa: SIM115 - lives as long as the console
        else:
            with contextlib.suppress(OSError):
                self._read_at = path.stat().st_size  # what was there is read at start (Timeline)
        self._lock = threading.Lock()
        self._listeners: list[Listener] = []
        self._pending = bytearray()
        """Bytes of events not yet written (the disk was full): written before any other."""
        self._left_out = 0
        """Events left out since the pending bytes reached ``PENDING_MAX``."""
        self.unwritten: str | None = None
        """Why the newest events are not in the file yet; None: they are."""

    def subscribe(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def record(self, kind: Kind, msg: str = "", *, at: float | None = None, **fields: Any) -> Event:
        """Append an event; ``at`` back-dates one observed earlier (default: now)."""
        data = fields.pop("data", {})
        event = Event(t=clock.wall() if at is None else at, kind=kind, msg=msg, data=data, **fields)
        if self._f is not None:
            line = _enc.encode(event) + b"\n"
            with self._lock:
                if len(self._pending) + len(line) <= PENDING_MAX:
                    self._pending += line
                else:
                    self._left_out += 1
                self._write_pending()
        if self._f is not None:  # a follower's listeners hear the owner's journal instead
            for listener in self._listeners:
                listener(event)
        return event

    def catch_up(self) -> int:
        """A follower: tell the listeners every event the owner appended since the last call
        (complete lines only); the number told. A file made anew (shorter) is read from 0."""
        if self._f is not None:
            return 0
        try:
            with open(self.path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size < self._read_at:
                    self._read_at = 0
                f.seek(self._read_at)
                data = f.read(max(0, size - self._read_at))
        except OSError:
            return 0
        end = data.rfind(b"\n") + 1
        self._read_at += end
        told = 0
        for line in data[:end].splitlines():
            try:
                event = _dec.decode(line)
            except msgspec.DecodeError:
                continue
            for listener in self._listeners:
                listener(event)
            told += 1
        return told

    def flush(self) -> bool:
        """Write what a full disk held back; True when nothing is left unwritten."""
        if self._f is None:
            return True
        with self._lock:
            self._write_pending()
            return not self._pending

    def _write_pending(self) -> None:
        assert self._f is not None
        while self._pending:
            try:
                n = self._f.write(self._pending)
            except OSError as e:
                self.unwritten = f"{self.path}: not written: {e.strerror or e}"
                return
            if not n:
                return
            del self._pending[:n]
            if not self._pending and self._left_out:
                note = Event(
                    t=clock.wall(),
                    kind=Kind.ALERT,
                    msg=f"{self._left_out} journal events left out: the disk was full",
                )
                self._pending += _enc.encode(note) + b"\n"
                self._left_out = 0
        self.unwritten = None

    def sync(self) -> None:
        if self._f is not None:
            self.flush()
            try:
                os.fsync(self._f.fileno())
            except OSError as e:
                self.unwritten = f"{self.path}: not synced: {e.strerror or e}"

    def close(self) -> None:
        if self._f is not None:
            self.flush()
            self._f.close()


TAIL_BYTES = 8 * 1024 * 1024
"""How much of a journal a console reads back for recent history (tens of thousands of events):
a journal grows for as long as the fleet runs, and startup must not grow with it."""


def read(
    path: Path, *, kinds: Collection[Kind] | None = None, tail_bytes: int | None = None
) -> Iterator[Event]:
    """Every complete event in a journal; a torn last line (a crash mid-write) is skipped.

    ``kinds``: only events of these kinds, found on their bytes and only those lines decoded
    (a long journal is mostly progress). ``tail_bytes``: only the events that start in the
    last ``tail_bytes`` bytes of the file.
    """
    try:
        f = open(path, "rb")  # noqa: SIM115
    except FileNotFoundError:
        return
    with f:
        if tail_bytes is not None:
            size = os.fstat(f.fileno()).st_size
            if size > tail_bytes:
                f.seek(size - tail_bytes - 1)
                f.readline()  # the end of a line that started before the tail (or its newline)
        if kinds is None:
            lines: Iterator[bytes] = iter(f)
        else:
            lines = matching_lines(f, [b'"kind":"%s"' % k.encode() for k in kinds])
        for line in lines:
            if not line.endswith(b"\n"):
                break
            try:
                event = _dec.decode(line)
            except msgspec.DecodeError:
                continue
            if kinds is None or event.kind in kinds:
                yield event


def read_all(paths: Collection[Path], *, kinds: Collection[Kind] | None = None) -> list[Event]:
    """Every controller's journal as one timeline (standby controllers: each journals what it
    decided while it led, in its own state dir), in time order; one journal is ``read``."""
    if len(paths) == 1:
        return list(read(next(iter(paths)), kinds=kinds))
    return sorted((e for p in paths for e in read(p, kinds=kinds)), key=lambda e: e.t)


def matching_lines(f: BinaryIO, needles: list[bytes], chunk: int = 1 << 22) -> Iterator[bytes]:
    """The complete lines of ``f`` that contain any of ``needles``, in file order: searched in
    large blocks (a rare kind in a 170 MB journal takes a fraction of a second, not a pass
    over every line in Python)."""
    carry = b""
    while block := f.read(chunk):
        data = carry + block
        end = data.rfind(b"\n") + 1
        data, carry = data[:end], data[end:]
        found: dict[int, int] = {}
        for needle in needles:
            at = data.find(needle)
            while at != -1:
                start = data.rfind(b"\n", 0, at) + 1
                stop = data.index(b"\n", at) + 1
                found[start] = stop
                at = data.find(needle, stop)
        for start in sorted(found):
            yield data[start : found[start]]


def is_longer_than(path: Path, size: int) -> bool:
    try:
        return path.stat().st_size > size
    except FileNotFoundError:
        return False
