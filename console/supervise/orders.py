"""An operator's orders to one job (move, checkpoint now, stop, answer a failover question),
sent to its executor; one that cannot be delivered is journalled and alerted, never taken
as done.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from console.records.journal import Journal, Kind
from console.states import JobState
from console.supervise.incident import OpenIncident
from console.supervise.live import Alert, KeptMove, LiveJob, Transitions
from protocol.faults import StopReason
from protocol.messages import CheckpointNow, ConsoleMessage, Drain, Stop

ON_ITS_WAY = frozenset(
    {
        JobState.PENDING,
        JobState.DEPLOYING,
        JobState.RESTARTING,
        JobState.FAILING_OVER,
        JobState.UNREACHABLE,
    }
)
"""States a job leaves for training by a launch, an answer again after a silence (or for an
end): a move asked for in one is kept until it trains, not dropped; it is moot if the job
trains off the host it was to leave by then (a failover took it elsewhere). Not kept: one
checkpointing is moving already, and one that ended trains no more."""


class Orders:
    def __init__(
        self,
        live: LiveJob,
        *,
        states: Transitions,
        incident: OpenIncident,
        journal: Journal,
        alert: Alert,
        wake: Callable[[], None],
        hosts: Callable[[], list[str]],
    ) -> None:
        self._live = live
        self._hosts = hosts
        """The hosts the job trains on now (one; a group's members)."""
        self._states = states
        self._incident = incident
        self._journal = journal
        self._alert = alert
        self._wake = wake
        """Wake whatever waits for the fleet to change (a supervisor waiting for a host)."""

    def request_move(
        self, reason: StopReason, why: str, target: str | None = None, off: str | None = None
    ) -> None:
        """Planned migration: checkpoint at the current step, stop, then move (0 lost steps).
        ``off``: the host the job is to leave (an operator's drain of it).

        Only a job that trains can be moved so. One on its way to training (being deployed,
        restarted or failed over, or unreachable) has no step to checkpoint yet: the move is
        kept, journalled as such, and made once it trains a step (``trains``); one that cannot
        train (checkpointing already, ended) is reported as not delivered (never raised)."""
        job = self._live
        if (
            job.state in ON_ITS_WAY
            or job.link is None
            or not job.machine.can(JobState.CHECKPOINTING)
        ):
            if job.state in ON_ITS_WAY and not job.stop_requested:
                job.move_kept = KeptMove(reason, why, target, off)
                self._journal.record(
                    Kind.ACTION,
                    f"{job.name}: move kept: it is {job.state.value}; it moves "
                    + (f"to {target} " if target else "")
                    + "once it trains",
                    job=job.name,
                    host=job.host,
                    data={"order": "drain", "delivered": False, "kept": True, "target": target},
                )
                return
            self._undelivered("drain", f"{job.name} is {job.state.value}, not training")
            return
        job.move_kept = None
        if target is not None:
            self._live.target = target
        if reason is StopReason.MIGRATE and job.host is not None:
            # a move off a host still fit: the recovery leaves it (``what_next.unfit``), where a
            # planned stop on a fit host restarts there
            job.leave.setdefault(job.host, f"the job is moved off it ({why})")
        self._incident.open(reason, why, planned=True)
        self._states.move(JobState.CHECKPOINTING, why)
        self._send(Drain(reason=reason), "drain")

    def trains(self) -> None:
        """The job trained a step: a move kept meanwhile is made now, once the job runs and
        its recovery (if any) is over, unless it was told to stop or trains where the move
        would take it. (Made at the restart's Start, the move joined the crash's incident and
        its checkpoint was of no step trained since.)"""
        job = self._live
        if job.move_kept is None or job.state is not JobState.RUNNING or job.incident is not None:
            return
        kept, job.move_kept = job.move_kept, None
        reason, why, target, off = kept
        if job.stop_requested:
            return
        moot = (
            (f"it no longer trains on {off}", {"off": off})
            if off is not None and off not in self._hosts()
            else (f"it trains on {target} already", {"target": target})
            if target is not None and job.host == target
            else None
        )
        if moot is not None:
            said, where = moot
            self._journal.record(
                Kind.ACTION,
                f"{job.name}: move kept is moot: {said}",
                job=job.name,
                host=job.host,
                data={"order": "drain", "delivered": False, "moot": True, **where},
            )
            return
        self.request_move(reason, why, target, off)

    def request_checkpoint(self) -> None:
        self._send(CheckpointNow(reason="operator"), "checkpoint now")

    def request_stop(self) -> None:
        """Stop at the next step boundary; with no executor to tell (the job waits for a host,
        an approval, or a lease to run out), it stops before anything else is started."""
        job = self._live
        job.stop_requested = True
        if job.link is None:
            self._journal.record(
                Kind.ACTION,
                f"{job.name}: no executor to tell; it stops before anything is started again",
                job=job.name,
                data={"order": "stop", "delivered": False, "deferred": True},
            )
            self.answer(False)
            self._wake()  # wakes a supervisor waiting for a host
            return
        self._send(Stop(reason=StopReason.OPERATOR, checkpoint=True), "stop")

    def answer(self, approved: bool, target: str | None = None) -> bool:
        job = self._live
        if job.approval is None or job.approval.done():
            return False
        job.target = target
        job.approval.set_result(approved)
        return True

    def _send(self, msg: ConsoleMessage, order: str) -> None:
        """Send an operator's order; one that cannot be delivered is journalled and alerted as
        such, never taken as done."""
        link = self._live.link
        if link is None:
            self._undelivered(order, "no executor is linked")
            return
        task = asyncio.get_running_loop().create_task(link.send(msg))

        def sent(t: asyncio.Task[None]) -> None:
            if not t.cancelled() and t.exception() is not None:
                self._undelivered(order, str(t.exception()))

        task.add_done_callback(sent)

    def _undelivered(self, order: str, why: str) -> None:
        job = self._live
        self._journal.record(
            Kind.ACTION,
            f"{job.name}: {order} NOT delivered: {why}",
            job=job.name,
            host=job.host,
            data={"order": order, "delivered": False, "error": why},
        )
        self._alert(f"{order} of {job.name} could not be delivered: {why}", job=job.name)
