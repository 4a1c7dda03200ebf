"""What the console knows of a job's run, as points on its step axis: progress, checkpoints,
replica lag and incidents.

A point belongs to one series (``progress``, ``checkpoint``, ``replica/HOST``, ``incident``,
``incident_lost``); a writer keeps each series to strictly rising steps. Progress arrives as
``Progress`` messages (every one the console gets); the rest is read off the journal's events,
the record every other reader of the console uses too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from console.records.journal import Event, Kind
from protocol.messages import Progress


@dataclass(frozen=True)
class Point:
    job: str
    series: str
    """Steps rise strictly within a series: a point at or below the series' last step is a
    step trained again after a resume, and is not written twice."""
    step: int
    wall: float
    """When it happened (seconds since the epoch)."""
    scalars: dict[str, float] = field(default_factory=dict)
    """Tag -> value."""
    texts: dict[str, str] = field(default_factory=dict)
    """Tag -> text (markdown)."""
    event: bool = False
    """Something that happened once (an incident), never dropped: when its step is not past
    the series' last one, it is written one step after that instead."""


def progress_point(job: str, msg: Progress, wall: float) -> Point:
    scalars = {"progress/steps_per_s": msg.steps_per_s, "progress/tokens_per_s": msg.tokens_per_s}
    if math.isfinite(msg.loss):
        scalars["progress/loss"] = msg.loss
    return Point(job, "progress", msg.step, wall, scalars)


class Translate:
    """Journal events to points; remembers what a later event of the same job needs (the newest
    step each job reported, the step each open incident stood at)."""

    def __init__(self) -> None:
        self._newest: dict[str, int] = {}
        """Job -> its newest checkpoint's step (a replica's lag in steps is counted from it,
        as the Jobs view counts it: a replica of the newest checkpoint lags 0 steps)."""
        self._incident_step: dict[int, int] = {}
        """Incident -> the step its job had reached when it was detected (where it is drawn)."""
        self._last_step: dict[int, int] = {}
        """Incident -> the last step trained before it, as its phases learn it."""

    def progress(self, job: str, msg: Progress, wall: float) -> Point:
        return progress_point(job, msg, wall)

    def event(self, e: Event) -> list[Point]:
        job, data = e.job, e.data
        if job is None:
            return []
        if e.kind is Kind.CHECKPOINT and isinstance(data.get("step"), int):
            return [self._checkpoint(job, e)]
        if e.kind is Kind.REPLICA and data.get("ok") and isinstance(data.get("step"), int):
            return [self._replica(job, e)]
        if e.kind is Kind.INCIDENT and e.incident is not None:
            return self._incident(job, e, e.incident)
        return []

    def _checkpoint(self, job: str, e: Event) -> Point:
        self._newest[job] = max(self._newest.get(job, 0), e.data["step"])
        scalars = {
            f"checkpoint/{name}": float(e.data[key])
            for key, name in (("stall_s", "stall_s"), ("write_s", "write_s"), ("bytes", "bytes"))
            if isinstance(e.data.get(key), int | float)
        }
        return Point(job, "checkpoint", e.data["step"], e.t, scalars)

    def _replica(self, job: str, e: Event) -> Point:
        spare, step = e.host or "?", e.data["step"]
        scalars: dict[str, float] = {}
        if isinstance(e.data.get("lag_s"), int | float):
            scalars[f"replica/{spare}/lag_s"] = float(e.data["lag_s"])
        if job in self._newest:
            scalars[f"replica/{spare}/lag_steps"] = float(max(0, self._newest[job] - step))
        return Point(job, f"replica/{spare}", step, e.t, scalars)

    def _incident(self, job: str, e: Event, n: int) -> list[Point]:
        phase, last = e.data.get("phase"), e.data.get("last_step")
        if phase == "detected":
            step = last if isinstance(last, int) else 0
            self._incident_step[n] = self._last_step[n] = step
            text = e.msg  # "incident N: JOB on HOST: CLASS: what was seen"
            return [
                Point(
                    job,
                    "incident",
                    step,
                    e.t,
                    {"incidents/opened": 1.0},
                    {"incidents/detected": text},
                    event=True,
                )
            ]
        if isinstance(last, int) and n in self._last_step:  # a later phase may know a later step
            self._last_step[n] = max(self._last_step[n], last)
        if phase == "loaded" and n in self._incident_step and isinstance(e.data.get("step"), int):
            at = self._incident_step[n]
            lost = max(0, self._last_step[n] - e.data["step"])
            text = f"incident {n}: resumed at step {e.data['step']}, {lost} steps lost"
            return [
                Point(
                    job,
                    "incident_lost",
                    at,
                    e.t,
                    {"incidents/lost_steps": float(lost)},
                    {"incidents/resumed": text},
                    event=True,
                )
            ]
        return []
