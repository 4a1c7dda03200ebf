"""A job's open incident: opened once per fault, its phases recorded as recovery goes on,
resolved (by Watch) at the first step trained after it, or ended unrecovered when the job
stops or fails (``Transitions``), and carried on when the job is started again.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from console import clock
from console.records.incidents import Incident, IncidentLog, Resolution
from console.supervise.live import LiveJob
from protocol.messages import Progress

PREEMPTED_WHY = "SIGTERM: checkpoint now, then migrate"
"""A preemption's incident, whether its Fault was read or only its Stopped."""


class OpenIncident:
    def __init__(self, live: LiveJob, *, log: IncidentLog, preparing: Callable[[], bool]) -> None:
        self._live = live
        self._log = log
        self._preparing = preparing
        """Whether a failover is being prepared (its phases may come before the incident)."""
        self._early: list[tuple[str, float, dict[str, object]]] = []

    def open(self, fault_class: str, why: str, *, planned: bool = False) -> None:
        job = self._live
        if job.incident is not None or job.host is None:
            return
        fault_at = (
            clock.wall() - max(0.0, time.monotonic() - job.last_seen)
            if job.last_seen
            else clock.wall()
        )
        job.resumed_step = None
        early, self._early = self._early, []
        job.incident = self._log.open(
            job.name,
            job.host,
            fault_class,
            fault_at=fault_at,
            # A checkpoint at step N means step N was completed, whatever Progress said last.
            last_step=max(job.step, job.checkpoint.step if job.checkpoint else 0),
            msg=why,
            planned=planned,
        )
        for phase, at, data in early:
            self._log.phase(
                job.incident,
                job.name,
                phase,
                f"incident {job.incident}: {job.name}: {phase}",
                at=at,
                **data,
            )

    def phase(self, phase: str, **data: Any) -> None:
        """Record a phase of the open incident; phases seen before it opens (a failover being
        prepared while the lease runs out) are kept with their times until it does."""
        job = self._live
        if job.incident is None:
            if self._preparing():
                self._early.append((phase, clock.wall(), data))
            return
        self._log.phase(
            job.incident,
            job.name,
            phase,
            f"incident {job.incident}: {job.name}: {phase}",
            **data,
        )

    def forget_early(self) -> None:
        """A preparation was called off: its phases belong to no incident."""
        self._early = []

    def in_executor(self, fault: str, step: int, why: str) -> None:
        """NaN and OOM are handled inside the executor (roll back and skip the batch; halve the
        micro-batch): no restart, but an incident all the same, resolved at the next step."""
        job = self._live
        job.step = max(job.step, step - 1)  # the executor got this far before the fault
        self.open(fault, why)
        if fault == "oom":
            self.phase("decided", action="halve the micro-batch")
            job.resumed_step = step - 1  # the step is retried, nothing is lost
            self.phase("loaded", step=step - 1)
        else:
            self.phase("decided", action="roll back and skip the batch")  # Resumed follows


def trained_past(msg: Progress, resumed: int) -> bool:
    """Does this progress show a step trained after a recovery (what resolves its incident):
    past the step resumed from, or the run's last step (a console that took over as the run
    ended sees no step past the one it found)?"""
    return msg.step > resumed or msg.step == msg.steps


def carry_on(found: list[Incident], log: IncidentLog, job: str) -> int | None:
    """A job started again by an operator: if its last incident ended it (stopped, failed)
    before it recovered, that incident goes on (``started``) and is returned; the resume to
    come is that fault's, and so are its lost steps and its time to recover."""
    last = next((i for i in reversed(found) if i.job == job), None)
    if last is None or last.resolution not in (Resolution.STOPPED, Resolution.FAILED):
        return None
    log.phase(
        last.id,
        job,
        "started",
        f"incident {last.id}: {job} started again by an operator; it resumes from its newest "
        "checkpoint",
    )
    return last.id
