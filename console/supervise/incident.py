"""A job's open incident: opened once per fault, its phases recorded as recovery goes on,
resolved (by what rank 0 says) at the first step trained after it, or ended unrecovered when the job
stops or fails (``Transitions``), and carried on when the job is started again.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from console import clock
from console.records.incidents import Incident, IncidentLog, Resolution
from console.supervise.live import LiveJob
from protocol.messages import Fault, FaultKind, Progress


def preempted_why(host: str) -> str:
    """A preemption's incident, whether its Fault was read or only its Stopped."""
    return f"SIGTERM on {host}: checkpoint now, then move"


class OpenIncident:
    def __init__(self, live: LiveJob, *, log: IncidentLog, preparing: Callable[[], bool]) -> None:
        self._live = live
        self._log = log
        self._preparing = preparing
        """Whether a failover is being prepared (its phases may come before the incident)."""
        self._early: list[tuple[str, float, dict[str, object]]] = []
        self._echoes: tuple[tuple[int, int], int] | None = None
        """((step, epoch) of the last NaN heard, how many of the other members' reports of it
        are still to come): every member of a group sees a NaN."""

    def open(
        self,
        fault_class: str,
        why: str,
        *,
        planned: bool = False,
        member: tuple[str, float] | None = None,
    ) -> None:
        """Open the job's incident (none if one is open). ``member``: the host that failed and
        when it was last heard from (a group's member), else the job's host and its last
        word; the fault time is that word's."""
        job = self._live
        host, last_seen = member if member is not None else (job.host, job.last_seen)
        if job.incident is not None or host is None:
            return
        fault_at = (
            clock.wall() - max(0.0, time.monotonic() - last_seen) if last_seen else clock.wall()
        )
        job.resumed_step = None
        early, self._early = self._early, []
        job.incident = self._log.open(
            job.name,
            host,
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

    def finished(self, step: int) -> None:
        """The run finished at ``step``: an incident whose recovery resumed it is resolved by
        the finish when no step was left to train past the one it resumed from (a failover
        that promoted the last step's replica: the run loads it and ends, with no Progress
        after). Its time to recover runs to the finish. Before, it stayed open though the job
        had finished (chaos seed 30 of the 200-fault torchrun run: "not resolved")."""
        job = self._live
        if job.incident is None or job.resumed_step is None or step < job.resumed_step:
            return
        self.phase("first_step", step=step)
        job.incident = None

    def forget_early(self) -> None:
        """A preparation was called off: its phases belong to no incident."""
        self._early = []

    def of_fault(self, msg: Fault, host: str, last_seen: float) -> None:
        """The incident an executor's own Fault opens, the same for a single host and a
        group's member (``host``, heard from at ``last_seen``): a preemption (planned; its
        move follows), a NaN or an OOM (handled in the executor). Other faults' incidents are
        opened by what the supervisor does about them (a restart, a failover)."""
        member = (host, last_seen)
        if msg.fault == FaultKind.PREEMPTED:
            self.open("preemption", preempted_why(host), planned=True, member=member)
        elif (
            msg.fault in (FaultKind.NAN, FaultKind.OOM)
            and not self._echo(msg)  # counted whether an incident is open or not
            and self._live.incident is None
        ):
            self._in_executor(msg.fault, msg.step, msg.message, member)

    def _echo(self, msg: Fault) -> bool:
        """Is ``msg`` another member's report of a NaN already heard? In a group each member
        reports the one NaN at its step; one read after the recovery (a member's link read
        late, a loaded console) opened a second incident of it, never resolved, and an OOM
        that followed was taken into that one (the report said "nan, not recovered")."""
        if msg.fault != FaultKind.NAN:
            return False
        key = (msg.step, self._live.epoch)
        if self._echoes is not None and self._echoes[0] == key and self._echoes[1] > 0:
            self._echoes = (key, self._echoes[1] - 1)
            return True
        # a first report (or another NaN at that step, once every member reported the last):
        # the other members' reports of it are echoes
        self._echoes = (key, max(0, len(self._live.rec.members) - 1))
        return False

    def _in_executor(
        self, fault: FaultKind, step: int, why: str, member: tuple[str, float]
    ) -> None:
        """NaN and OOM are handled inside the executor (roll back and skip the batch; halve the
        micro-batch): no restart, but an incident all the same, resolved at the next step. In
        a group every member sees a NaN (the loss is reduced): the first one heard opens it."""
        job = self._live
        job.step = max(job.step, step - 1)  # the executor got this far before the fault
        self.open(fault, why, member=member)
        if fault == FaultKind.OOM:
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
