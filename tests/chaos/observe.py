"""What the chaos run reads: the console's journal (put back on the real clock when the
console's wall clock was stepped) and each executor's own events.jsonl. The processes and
the disks are watched by ``chaos.procs`` and ``chaos.disk``."""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from console.records.incidents import Incident, incidents
from console.records.journal import Event, Kind, read_all

TRAIN_THREAD = "hotspare-train"
"""The OS name of an executor's training thread (executors/agent/serve.py); idle executors have none."""
SAMPLE_S = 0.1


CLOCK_STEP_MIN_S = 3600.0
"""The wall_clock_step fault steps the console's wall clock by at least this much."""


def journal(state_dir: Path | Sequence[Path], shifts: Sequence[float] = ()) -> list[Event]:
    """The console's journal (several controllers' as one timeline); with ``shifts`` (the
    wall-clock steps the console was given), the events it stamped while stepped are put back
    on the real clock (``unshift``)."""
    dirs = [state_dir] if isinstance(state_dir, Path) else list(state_dir)
    events = read_all([d / "journal.jsonl" for d in dirs])
    return unshift(events, shifts) if shifts else events


def unshift(events: list[Event], shifts: Sequence[float], now: float | None = None) -> list[Event]:
    """Undo the console's stepped wall clock in its journal's times.

    A step is an hour or more and an episode lasts minutes, so an event stamped more than half
    a step away from now was stamped while stepped, by the one step that brings it near now.
    (The console stamps some events with its stepped clock and back-dates others with the
    real one: each is judged on its own.)
    """
    now = time.time() if now is None else now
    half = CLOCK_STEP_MIN_S / 2

    def real(t: float) -> float:
        if abs(t - now) > half:
            for off in shifts:
                if off and abs(t - off - now) <= half:
                    return t - off
        return t

    for e in events:
        e.t = real(e.t)
        if isinstance(e.data.get("fault_at"), float):
            e.data["fault_at"] = real(e.data["fault_at"])
    return events


@dataclass
class JobView:
    """One job as the journal tells it now."""

    state: str = "pending"
    host: str | None = None
    epoch: int = 0
    spares: list[str] = field(default_factory=list)
    running_since: float = 0.0
    placed: str | None = None
    """The host of the newest placement: where a recovery under way is starting the job."""
    finished: bool = False
    open_incidents: list[Incident] = field(default_factory=list)
    orphaned: list[Incident] = field(default_factory=list)
    """Unresolved incidents a console that has since died had opened: the console after it
    opens one of its own (console_restart) and never closes these."""


def job_view(events: list[Event], job: str) -> JobView:
    v = JobView()
    for e in events:
        if e.job != job:
            continue
        if e.kind is Kind.JOB_STATE:
            v.state = e.data.get("to", v.state)
            if v.state == "running":
                v.host, v.epoch, v.running_since = e.host, e.data.get("epoch", 0), e.t
        elif e.kind is Kind.PLACEMENT and "spares" in e.data:
            v.spares = list(e.data["spares"])
            if e.data.get("change") != "spare":  # a new spare's event names the spare
                v.placed = e.host
        elif e.kind is Kind.FINISHED:
            v.finished = True
    started = max((e.t for e in events if e.kind is Kind.CONSOLE and "started" in e.msg), default=0)
    for i in incidents(events):
        if i.job == job and not i.resolved:
            (v.orphaned if i.times["detected"] < started else v.open_incidents).append(i)
    return v


def json_lines(data: bytes) -> list[dict[str, Any]]:
    """Every complete JSON line (a torn last line is left out)."""
    out = []
    for line in data.split(b"\n")[:-1]:
        with contextlib.suppress(ValueError):
            out.append(json.loads(line))
    return out


def executor_events(workdir: Path) -> list[dict[str, Any]]:
    """Every event in an executor's events.jsonl (all executors that ran there)."""
    try:
        return json_lines((workdir / "events.jsonl").read_bytes())
    except OSError:
        return []


def events_size(workdir: Path) -> int:
    try:
        return (workdir / "events.jsonl").stat().st_size
    except OSError:
        return 0


def last_step(workdir: Path) -> int:
    """The newest step an executor there reported (its progress lines), 0 if none."""
    try:
        with open(workdir / "events.jsonl", "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - 16384))
            tail = f.read().split(b"\n")
    except OSError:
        return 0
    for line in reversed(tail):
        if b'"progress"' in line or b'"resumed"' in line:
            with contextlib.suppress(ValueError):
                return int(json.loads(line)["step"])
    return 0
