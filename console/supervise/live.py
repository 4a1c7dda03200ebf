"""One job as its supervision sees it now: shared by the pieces that supervise it (watch,
standby, recovery, orders, observe), each of which is handed this and no more of the console.

``Transitions`` moves the job's state machine and journals each move.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, NamedTuple, Protocol, TypeVar, overload

from console.fleet.link import ExecutorLink
from console.records.incidents import end_phase
from console.records.journal import Journal, Kind
from console.records.state_store import JobRecord
from console.states import JOB_TRANSITIONS, FailureKind, JobState, Machine
from console.supervise.outcome import Outcome
from protocol.faults import StopReason
from protocol.spec import CheckpointManifest, JobSpec

HISTORY_LEN = 600
"""Progress samples kept for the console's curves (one per Progress message)."""
LOG_TAIL_LEN = 200
CHECKPOINTS_KEPT = 12


class KeptMove(NamedTuple):
    """A move asked for while the job could not make it: made once it trains, unless moot."""

    reason: StopReason
    why: str
    target: str | None = None
    """The host an operator chose (moot once the job trains there)."""
    off: str | None = None
    """The host the move takes the job off (a drain's, a failover's): moot once the job trains
    elsewhere (a failover took it off meanwhile)."""


class Alert(Protocol):
    def __call__(self, msg: str, *, job: str | None = None, host: str | None = None) -> None: ...


@dataclass
class LiveJob:
    """What the pieces of one job's supervision share; each reads and writes it in place."""

    name: str
    spec: JobSpec
    rec: JobRecord
    """The job's persisted record (read again from the state file by a read-only console)."""
    machine: Machine[JobState] = field(
        default_factory=lambda: Machine(JobState.PENDING, JOB_TRANSITIONS)
    )
    failure: FailureKind | None = None
    why: str = ""
    host: str | None = None
    spares: list[str] = field(default_factory=list)
    link: ExecutorLink | None = None
    """The link to the executor training the job, while there is one."""
    faulted: ExecutorLink | None = None
    """The link to an executor whose run died (``RunEnded``) and which waits, alive, for a
    Start that restarts the run in place; taken by the restart or told to stop."""
    last_seen: float = 0.0
    """When the executor was last heard from (monotonic)."""
    step: int = 0
    loss: float = math.nan
    steps_per_s: float = 0.0
    rates: dict[int, tuple[float, float]] = field(default_factory=dict)
    """World size -> (steps/s, wall time said) of the last Progress at that size (an elastic
    group's throughput at each size it trained at)."""
    checkpoint: CheckpointManifest | None = None
    checkpoint_path: str | None = None
    history: deque[tuple[float, int, float, float]] = field(
        default_factory=lambda: deque(maxlen=HISTORY_LEN)
    )
    """(time, step, loss, steps/s) per Progress message, oldest first."""
    checkpoints: deque[tuple[str, CheckpointManifest]] = field(
        default_factory=lambda: deque(maxlen=CHECKPOINTS_KEPT)
    )
    """(host written on, manifest) of the newest checkpoints, oldest first."""
    log_tail: deque[str] = field(default_factory=lambda: deque(maxlen=LOG_TAIL_LEN))
    """The executor's Log and Fault lines, newest last."""
    exit: Outcome | None = None
    """How the executor's run ended, once a message said so."""
    incident: int | None = None
    resumed_step: int | None = None
    sha256: str | None = None
    approval: asyncio.Future[bool] | None = None
    """An operator's answer awaited before a failover (manual and ask policies)."""
    told: bool = False
    """A view's copy whose state, why and approval the owning controller tells it (through
    its control socket): the view's own observer leaves them alone."""
    target: str | None = None
    """An operator's chosen failover host."""
    leave: dict[str, str] = field(default_factory=dict)
    """Hosts the job's ranks leave at its next run though they are fit, each with why (a GPU
    that warned sample after sample, an operator's move); emptied of a host once it is left."""
    stop_requested: bool = False
    """An operator asked this job to stop (remembered across consoles once it has)."""
    move_kept: KeptMove | None = None
    """A move asked for while the job was on its way to training (deploying, restarting,
    failing over) or unreachable: made once it trains (``Orders.trains``)."""

    @property
    def state(self) -> JobState:
        return self.machine.state

    @property
    def awaiting_approval(self) -> bool:
        """A failover waits for an operator's answer (manual policy)."""
        return self.approval is not None and not self.approval.done()

    @property
    def epoch(self) -> int:
        return self.rec.epoch

    def carry_from(self, before: LiveJob) -> None:
        """A job started again (``g``) under a new supervisor shows what it last did (its
        step, loss, checkpoints, curve and log) until its new executor says where it resumes;
        it read ``0/600`` meanwhile. Its rate is not carried: nothing trains yet."""
        self.step, self.loss = before.step, before.loss
        self.checkpoint, self.checkpoint_path = before.checkpoint, before.checkpoint_path
        self.history.extend(before.history)
        self.checkpoints.extend(before.checkpoints)
        self.log_tail.extend(before.log_tail)


class Transitions:
    """The job's state moves, each journalled; a failure, or a wait, is also an alert. A job
    that stops or fails with an incident open ends that incident, unrecovered, saying why
    (a report must not leave it open forever)."""

    def __init__(
        self, live: LiveJob, *, journal: Journal, alert: Alert, alerted: Callable[[str], bool]
    ) -> None:
        self._live = live
        self._journal = journal
        self._alert = alert
        self._alerted = alerted
        """Whether an alert of this text went out lately (so a wait is not alerted again)."""

    def move(self, state: JobState, why: str = "") -> None:
        job = self._live
        before = job.state
        if job.machine.move(state):
            job.why = why
            self._journal.record(
                Kind.JOB_STATE,
                f"{job.name}: {before.value} -> {state.value}" + (f" ({why})" if why else ""),
                job=job.name,
                host=job.host,
                data={"from": before.value, "to": state.value, "why": why, "epoch": job.epoch},
            )

    def fail(self, kind: FailureKind, why: str) -> None:
        """Failed, with an alert; a stop an operator asked for (``s``, a failover denied) is
        no failure: it is ``stopped``, with none."""
        job = self._live
        if kind is FailureKind.STOPPED and (job.stop_requested or job.rec.stopped):
            self.stopped(why)
            return
        job.failure = kind
        self.move(JobState.FAILED, f"{kind.value}: {why}")
        self._end_incident(JobState.FAILED, f"{kind.value}: {why}")
        self._alert(f"job {job.name} failed ({kind.value}): {why}", job=job.name)

    def stopped(self, why: str) -> None:
        """An operator stopped the job: terminal, not a failure, no alert."""
        self._live.failure = None
        self.move(JobState.STOPPED, why)
        self._end_incident(JobState.STOPPED, why)

    def _end_incident(self, state: JobState, why: str) -> None:
        job = self._live
        if job.incident is not None and job.state is state:
            end_phase(self._journal, job.incident, job.name, state.value, why)
            n, job.incident = job.incident, None
            job.rec.open_incidents = [i for i in job.rec.open_incidents if i != n]  # next save

    def wait_note(self, why: str) -> None:
        """The job waits (for a host, a spare): pending, with an alert not repeated too often.
        A job pending already (its start) is given the note too: it kept an empty one, and
        alerted again at every wait, as the note never matched."""
        if self._live.state is not JobState.PENDING:
            self.move(JobState.PENDING, why)
        new = self._live.why != why
        self._live.why = why
        if new or not self._alerted(why):
            self._alert(why, job=self._live.name)


T = TypeVar("T")


class HasLive(Protocol):
    live: LiveJob


class LiveField(Generic[T]):
    """An attribute of a job's supervisor that is its ``LiveJob``'s (what the console's views
    read): ``sup.step`` is ``sup.live.step``."""

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name

    @overload
    def __get__(self, sup: None, owner: type | None = None) -> LiveField[T]: ...
    @overload
    def __get__(self, sup: HasLive, owner: type | None = None) -> T: ...
    def __get__(self, sup: HasLive | None, owner: type | None = None) -> T | LiveField[T]:
        return self if sup is None else getattr(sup.live, self._name)

    def __set__(self, sup: HasLive, value: T) -> None:
        setattr(sup.live, self._name, value)
