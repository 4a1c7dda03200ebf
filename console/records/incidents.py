"""Incident timelines in the journal, and the MTTR figures computed from them.

Phases, in order: detected, decided, transfer_done, executor_up, loaded, first_step.
MTTR runs from the fault (the last sign of life before detection) to the first step.

An incident whose job ends before it recovers (an operator stops it, or denies its failover;
the job fails) is ``ended``: not recovered, and it says why. A job started again after that
(``g``) carries on in the same incident (``started``): its resume is that fault's, so the
steps it lost and its time to recover are counted there, the time it stood stopped shown
apart. For example::

    detected (host_lost, last step 161) -> ended (stopped: failover denied) -> started
    -> decided (failover to b) -> loaded (step 140) -> first_step: recovered, 21 steps lost
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from console.records.journal import Event, Journal, Kind
from console.records.state_store import StateStore

PHASES = (
    "detected",
    "ended",
    "started",
    "decided",
    "transfer_done",
    "executor_up",
    "loaded",
    "first_step",
)
"""``ended``: the job stopped or failed while the incident was open; ``started``: the job was
started again after that, and the incident goes on."""
ENDINGS = ("stopped", "failed")
"""Job states that end an incident unrecovered (``ended``'s ``state``)."""


class Resolution(StrEnum):
    """How an incident stands, read from its phases (the last of ended and started counts)."""

    RECOVERED = "recovered"
    """The job trained a step after it (``first_step``): MTTR and lost steps are known."""
    STOPPED = "stopped"
    """An operator stopped the job (``s``, a failover denied) before it recovered."""
    FAILED = "failed"
    """The job failed before it recovered (a config error, the restart limit)."""
    OPEN = "open"
    """Recovery is under way, or waits (for an operator, a host, a lease)."""


def record_phase(
    journal: Journal,
    n: int,
    job: str,
    phase: str,
    msg: str = "",
    *,
    at: float | None = None,
    **data: Any,
) -> None:
    """One phase of incident ``n`` in the journal."""
    journal.record(
        Kind.INCIDENT,
        msg or f"incident {n}: {phase}",
        at=at,
        job=job,
        incident=n,
        data={"phase": phase, **data},
    )


def end_phase(journal: Journal, n: int, job: str, state: str, why: str) -> None:
    """Incident ``n`` ends unrecovered: its job went to ``state`` (stopped or failed)."""
    record_phase(
        journal,
        n,
        job,
        "ended",
        f"incident {n}: {job} {state} before it recovered: {why}",
        state=state,
        why=why,
    )


class IncidentLog:
    def __init__(self, journal: Journal, store: StateStore) -> None:
        self.journal = journal
        self.store = store

    def open(
        self,
        job: str,
        host: str,
        fault_class: str,
        *,
        fault_at: float,
        last_step: int,
        msg: str,
        planned: bool = False,
    ) -> int:
        n = self.store.new_incident(job)
        self.journal.record(
            Kind.INCIDENT,
            f"incident {n}: {job} on {host}: {fault_class}: {msg}",
            job=job,
            host=host,
            incident=n,
            data={
                "phase": "detected",
                "class": fault_class,
                "fault_at": fault_at,
                "last_step": last_step,
                "planned": planned,
            },
        )
        return n

    def phase(
        self, n: int, job: str, phase: str, msg: str = "", *, at: float | None = None, **data: Any
    ) -> None:
        record_phase(self.journal, n, job, phase, msg, at=at, **data)
        if phase == "first_step" or (phase == "ended" and data.get("state") in ENDINGS):
            self.store.incident_open(job, n, False)
        elif phase == "started":
            self.store.incident_open(job, n, True)


RESIZES = ("shrunk", "grown")
"""Classes an elastic group's change of size gives an incident (``console/supervise/group``)."""


@dataclass
class Incident:
    id: int
    job: str
    host: str
    fault_class: str
    fault_at: float
    last_step: int
    planned: bool
    cause: str | None = None
    """The fault that opened it, when its decision gave it another class (a host lost with no
    spare free: ``shrunk``)."""
    size: dict[str, int] | None = None
    """An elastic group's size change: ``from``, ``to``, ``planned``."""
    times: dict[str, float] = field(default_factory=dict)
    data: dict[str, dict[str, Any]] = field(default_factory=dict)
    lines: list[Event] = field(default_factory=list)

    resumed_steps: list[int] = field(default_factory=list)
    """The step of each ``loaded`` phase (a stopped job started again resumes again)."""
    ended: dict[str, Any] | None = None
    """The last ``ended`` phase's data (``state``, ``why``) while no ``started`` followed it."""
    stopped_once: bool = False
    """An operator stopped the job at least once while this incident was open."""

    @property
    def resumed_step(self) -> int | None:
        """The step training resumed from: the earliest resumed (steps past it were trained
        again, whichever later resume followed)."""
        return min(self.resumed_steps, default=None)

    @property
    def lost_steps(self) -> int | None:
        return None if self.resumed_step is None else max(0, self.last_step - self.resumed_step)

    @property
    def resolved(self) -> bool:
        return "first_step" in self.times

    @property
    def resolution(self) -> Resolution:
        if self.resolved:
            return Resolution.RECOVERED
        if self.ended is not None:
            return Resolution(self.ended.get("state", "stopped"))
        return Resolution.OPEN

    @property
    def ended_why(self) -> str:
        """Why the job stopped or failed before it recovered ('' unless it did)."""
        return str(self.ended.get("why") or "") if self.ended is not None else ""

    @property
    def mttr_s(self) -> float | None:
        return self.times["first_step"] - self.fault_at if self.resolved else None

    def breakdown(self) -> dict[str, float]:
        """Seconds spent in each stage: detect, decide, transfer, start, setup, load, first
        step; for a job stopped meanwhile, until it stopped and how long it stood stopped.

        ``load`` is the checkpoint's own load as the executor timed it (``load_s``) and
        ``setup`` the rest of the way from the executor's start to it (building the trainer,
        the command's set-up); an incident whose executor timed no load keeps the two as one,
        ``load``. (It read ``load 12.19 s`` for a checkpoint loaded in 0.09 s.)"""
        marks = [
            ("detect", "detected"),
            ("until stopped", "ended"),
            ("stopped", "started"),
            ("decide", "decided"),
            ("transfer", "transfer_done"),
            ("start", "executor_up"),
            ("load", "loaded"),
            ("first step", "first_step"),
        ]
        out: dict[str, float] = {}
        prev = self.fault_at
        for label, phase in marks:
            t = self.times.get(phase)
            if t is None:
                continue
            out[label] = max(0.0, t - prev)
            prev = max(prev, t)
        load_s = self.load_s
        if "load" in out and load_s is not None:
            whole = out.pop("load")
            first = out.pop("first step", None)
            out["setup"] = max(0.0, whole - load_s)
            out["load"] = min(whole, load_s)
            if first is not None:
                out["first step"] = first
        return out

    @property
    def load_s(self) -> float | None:
        """The checkpoint load the executor timed, in its ``loaded`` phase (None if none)."""
        loaded = next((e for e in self.lines if e.data.get("phase") == "loaded"), None)
        value = loaded.data.get("load_s") if loaded is not None else None
        return float(value) if isinstance(value, int | float) else None


def incidents(events: Iterable[Event]) -> list[Incident]:
    """Incidents rebuilt from journal events."""
    found: dict[int, Incident] = {}
    for e in events:
        if e.kind is not Kind.INCIDENT or e.incident is None:
            continue
        phase = e.data.get("phase", "")
        if phase == "detected":
            found[e.incident] = Incident(
                id=e.incident,
                job=e.job or "",
                host=e.host or "",
                fault_class=e.data.get("class", "?"),
                fault_at=e.data.get("fault_at", e.t),
                last_step=e.data.get("last_step", 0),
                planned=e.data.get("planned", False),
            )
        inc = found.get(e.incident)
        if inc is None:
            continue
        inc.lines.append(e)
        if isinstance(e.data.get("last_step"), int):  # a later phase may know a later step
            inc.last_step = max(inc.last_step, e.data["last_step"])
        cls = e.data.get("class")
        if (
            phase == "decided"
            and isinstance(cls, str)
            and inc.fault_class not in RESIZES  # a grow that lost its newcomer stays a grow
            and not inc.cause
        ):
            inc.cause, inc.fault_class = inc.fault_class, e.data["class"]
        if phase == "decided" and isinstance(e.data.get("size"), dict):
            inc.size = dict(e.data["size"])
        if phase == "loaded" and isinstance(e.data.get("step"), int):
            inc.resumed_steps.append(e.data["step"])
        if phase == "ended" and e.data.get("state") in ENDINGS:
            inc.ended = dict(e.data)
            inc.stopped_once = inc.stopped_once or e.data["state"] == "stopped"
        elif phase == "started":
            inc.ended = None
        inc.times.setdefault(phase, e.t)
        inc.data.setdefault(phase, dict(e.data))
    return sorted(found.values(), key=lambda i: i.id)


def unclean_exit(
    events: Iterable[Event], *, whole: bool = True
) -> tuple[float, dict[str, int]] | None:
    """If the last console of this journal died without "console stopped": when it was last
    heard of, and the last step it knew of each job; None after a clean stop.

    ``whole=False``: ``events`` are the journal's tail. A tail without any console event lies
    within one console's run, which did not stop cleanly (its last event would say so).
    """
    started = False
    seen_console = False
    last_t = 0.0
    steps: dict[str, int] = {}
    for e in events:
        last_t = e.t
        if e.kind is Kind.CONSOLE:
            seen_console = True
            started = e.msg.startswith("console started")
        elif e.job and "step" in e.data and e.kind in (Kind.PROGRESS, Kind.CHECKPOINT):
            steps[e.job] = max(steps.get(e.job, 0), int(e.data["step"]))
    if not whole and not seen_console and last_t:
        started = True
    return (last_t, steps) if started else None
