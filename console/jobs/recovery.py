"""What a job supervisor does once an executor's run has ended: the fault table of DESIGN.md.

transient -> relink (in watch); executor crash or hang -> restart in place up to N times;
host lost, GPU FAIL, drain, preemption -> fail over (same region first); config -> fail fast.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from console import clock
from console.jobs.outcome import Exit, Outcome
from console.jobs.placement import rank
from console.jobs.policy import Decision, decide
from console.jobs.replicator import Source
from console.reach.deploy import replica_dir, replica_file
from console.reach.remote import list_manifests
from console.reach.transport.base import TransportError
from console.records.journal import Kind
from console.states import FailureKind, HostState, JobState
from protocol.messages import CheckpointNow, ConsoleMessage, Drain, Stop

if TYPE_CHECKING:
    from console.jobs.supervisor import JobSupervisor

REPLICATE_WAIT_S = 120.0


class Recovery:
    """Mixed into JobSupervisor: recovery decisions, incidents and operator requests."""

    # -------------------------------------------------------------- incidents

    def _open_incident(
        self: JobSupervisor, fault_class: str, why: str, *, planned: bool = False
    ) -> None:
        if self.incident is not None or self.host is None:
            return
        fault_at = (
            clock.wall() - max(0.0, time.monotonic() - self.last_seen)
            if self.last_seen
            else clock.wall()
        )
        self.resumed_step = None
        early, self.early_phases = self.early_phases, []
        self.incident = self.ctl.incidents.open(
            self.name,
            self.host,
            fault_class,
            fault_at=fault_at,
            last_step=self.step,
            msg=why,
            planned=planned,
        )
        for phase, at, data in early:
            self.ctl.incidents.phase(
                self.incident,
                self.name,
                phase,
                f"incident {self.incident}: {self.name}: {phase}",
                at=at,
                **data,
            )

    def _phase(self: JobSupervisor, phase: str, **data: object) -> None:
        """Record a phase of the open incident; phases seen before it opens (a failover being
        prepared while the lease runs out) are kept with their times until it does."""
        if self.incident is None:
            if self._preparing is not None:
                self.early_phases.append((phase, clock.wall(), data))
            return
        self.ctl.incidents.phase(
            self.incident,
            self.name,
            phase,
            f"incident {self.incident}: {self.name}: {phase}",
            **data,
        )

    def _in_executor_incident(self: JobSupervisor, fault: str, step: int, why: str) -> None:
        """NaN and OOM are handled inside the executor (roll back and skip the batch; halve the
        micro-batch): no restart, but an incident all the same, resolved at the next step."""
        self.step = max(self.step, step - 1)  # the executor got this far before the fault
        self._open_incident(fault, why)
        if fault == "oom":
            self._phase("decided", action="halve the micro-batch")
            self.resumed_step = step - 1  # the step is retried, nothing is lost
            self._phase("loaded", step=step - 1)
        else:
            self._phase("decided", action="roll back and skip the batch")  # Resumed follows

    # ---------------------------------------------------------------- recover

    async def _recover(self: JobSupervisor, outcome: Outcome) -> tuple[str, bool] | None:
        """Act on how a run ended; returns where to launch next (host, promote a replica), or None."""
        ctl, host = self.ctl, self.host
        if outcome.exit is not Exit.HOST_LOST:
            await self._cancel_preparation()
        ctl.journal.record(
            Kind.EXECUTOR,
            f"{self.name}: executor on {host} ended: {outcome.exit.value}: {outcome.why}",
            job=self.name,
            host=host,
            data={"exit": outcome.exit.value, "step": outcome.step},
        )
        if outcome.exit in (Exit.FINISHED, Exit.CONFIG, Exit.STOPPED):
            await self._drop_standby()
        if outcome.exit is Exit.FINISHED:
            self.sha256 = outcome.sha256
            self.step = outcome.step or self.step
            self.rec.finished_sha256, self.rec.finished_step = outcome.sha256, self.step
            ctl.store.save()
            self._set(JobState.FINISHED, f"step {self.step}")
            ctl.journal.record(
                Kind.FINISHED,
                f"{self.name}: finished at step {self.step}, params sha256 {outcome.sha256}",
                job=self.name,
                host=host,
                data={"step": self.step, "params_sha256": outcome.sha256},
            )
            self._release()
            return None
        if outcome.exit is Exit.CONFIG:
            self._fail(FailureKind.CONFIG, outcome.why)
            self._release()
            return None
        if outcome.exit is Exit.STOPPED:
            if self.stop_requested:  # an operator's stop, not an executor's own
                self.rec.stopped = True
                ctl.store.save()
            self._fail(FailureKind.STOPPED, outcome.why)
            self._release()
            return None
        assert host is not None
        if outcome.exit in (Exit.CRASHED, Exit.HUNG, Exit.LEASE_LOST) and ctl.fleet.hosts[
            host
        ].state in (HostState.UP, HostState.SUSPECT, HostState.CORDONED):
            self._open_incident(outcome.exit.value, outcome.why)
            if self.rec.restarts < ctl.inv.console.restart_limit:
                self.rec.restarts += 1
                ctl.store.save()
                self._set(
                    JobState.RESTARTING,
                    f"{outcome.why}; restart {self.rec.restarts} of "
                    f"{ctl.inv.console.restart_limit} on {host}",
                )
                self._phase("decided", action="restart", host=host)
                return host, False
            self._set(JobState.RESTARTING, "restart limit reached")
        if outcome.exit is Exit.HOST_LOST:
            self._open_incident("host_lost", outcome.why)
            ctl.fleet.set_state(host, HostState.DOWN, outcome.why)
        if outcome.exit is Exit.PLANNED:
            self._open_incident("planned", outcome.why, planned=True)
            await self._replicate_final(host, outcome)
            if ctl.fleet.hosts[host].state is HostState.DRAINING:
                ctl.fleet.set_state(host, HostState.DRAINED, f"{self.name} moved off")
        return await self._failover(outcome)

    async def _replicate_final(self: JobSupervisor, host: str, outcome: Outcome) -> None:
        """A planned move: make sure the checkpoint at the stop reaches every spare before moving."""
        cp = self.checkpoint
        if cp is None or self.checkpoint_path is None:
            return
        for spare in self.spares:
            await self.ctl.replicator.wait_idle(self.name, spare, REPLICATE_WAIT_S)
            if not await self.ctl.replicator.copy(
                self.name, spare, Source(host, self.checkpoint_path, cp)
            ):
                self.ctl.alert(
                    f"{self.name}: the checkpoint at the stop (step {cp.step}) did not reach "
                    f"{spare}; a move there resumes from an older replica and loses steps",
                    job=self.name,
                )

    def _release(self: JobSupervisor) -> None:
        fleet = self.ctl.fleet
        if self.host and fleet.hosts[self.host].job == self.name:
            fleet.hosts[self.host].job = None
        self.spares = []
        fleet.changed.set()

    # --------------------------------------------------------------- failover

    async def _failover(self: JobSupervisor, outcome: Outcome) -> tuple[str, bool] | None:
        ctl = self.ctl
        old = self.host
        self._set(JobState.FAILING_OVER, outcome.why)
        operator = self.target is not None
        decision = decide(ctl.policy, failover=True, operator=operator)
        if decision is not Decision.ACT:
            verb = "approve" if decision is Decision.ASK else "fail over by hand"
            self._set(JobState.PENDING, f"waiting for an operator to {verb}: {outcome.why}")
            ctl.alert(
                f"{self.name} needs a failover off {old} ({outcome.why}); {verb} in the console",
                job=self.name,
            )
            self.approval = asyncio.get_running_loop().create_future()
            approved = await self.approval
            self.approval = None
            if not approved:
                self.rec.stopped = True
                ctl.store.save()
                self._fail(FailureKind.STOPPED, "failover denied by an operator")
                self._release()
                return None
        if old is not None and ctl.fleet.hosts[old].job == self.name:
            ctl.fleet.hosts[old].job = None
        target = await self._take_prepared(old)
        while target is None:
            target = await self._pick_target(old)
            if target is not None or self.stop_requested:
                break
            self._wait_note(f"no spare left for {self.name}: it waits for a host")
            await ctl.wait_for_hosts()
        self.target = None
        if target is None:  # an operator stopped the job while it waited for a host
            return old or "", False
        self.rec.restarts = 0
        self._phase("decided", action="failover", host=target)
        if self.prepared is not None and self.prepared.host == target:
            if not self.prepared.promoted:
                await self._ensure_replica(target)
            return target, not self.prepared.promoted
        await self._ensure_replica(target)
        return target, True

    async def _take_prepared(self: JobSupervisor, old: str | None) -> str | None:
        """The target readied during the lease wait, if it is still fit to use."""
        from console.jobs.supervisor import Prepared

        task, self._preparing = self._preparing, None
        prepared = (
            (await asyncio.gather(task, return_exceptions=True))[0] if task is not None else None
        )
        if not isinstance(prepared, Prepared):
            prepared, self.standby = self.standby, None
            if prepared is None:
                return None
        rt = self.ctl.fleet.hosts[prepared.host]
        if rt.state is HostState.UP and prepared.host != old and self._pumping(prepared.link):
            self.prepared = prepared
            return prepared.host
        await self._discard(prepared)
        return None

    async def _pick_target(self: JobSupervisor, old: str | None) -> str | None:
        ctl = self.ctl
        usable = ctl.fleet.usable(exclude={old} if old else None) | {
            h
            for h, rt in ctl.fleet.hosts.items()
            if rt.job == self.name and h != old and rt.state is HostState.UP
        }
        if self.target is not None:
            return self.target if self.target in usable else None
        home = ctl.inv.hosts[old].region if old else ""
        spares = [s for s in self.spares if s in usable]
        others = rank(
            ctl.inv,
            home,
            [h for h in usable if h not in spares and ctl.reserved(self.name).get(h) is None],
        )
        ordered = spares + others
        return ordered[0] if ordered else None

    async def _ensure_replica(self: JobSupervisor, target: str) -> None:
        """If ``target`` lacks the newest replica another reachable host holds, copy it there first."""
        ctl = self.ctl
        best: Source | None = None
        if (
            self.checkpoint is not None
            and self.checkpoint_path
            and self.host
            and ctl.fleet.hosts[self.host].state not in (HostState.DOWN, HostState.SUSPECT)
        ):
            best = Source(self.host, self.checkpoint_path, self.checkpoint)
        for (job, holder), st in ctl.replicator.state.items():
            m = st.manifest
            if (
                job == self.name
                and holder != target
                and m is not None
                and ctl.fleet.hosts[holder].state is not HostState.DOWN
                and (best is None or m.step > best.manifest.step)
            ):
                best = Source(holder, replica_file(ctl.inv.host_root(holder), self.name, m.step), m)
        if best is None:
            return
        have = ctl.replicator.replica(self.name, target).manifest
        if have is None:
            try:
                found = await list_manifests(
                    ctl.fleet.hosts[target].transport,
                    ctl.inv.python(target),
                    replica_dir(ctl.inv.host_root(target), self.name),
                )
                have = found[-1] if found else None
            except TransportError:
                have = None
        if have is None or have.step < best.manifest.step:
            await ctl.replicator.copy(self.name, target, best)

    # -------------------------------------------------------------- requests

    def request_move(self: JobSupervisor, reason: str, why: str, target: str | None = None) -> None:
        """Planned migration: checkpoint at the current step, stop, then move (0 lost steps)."""
        if target is not None:
            self.target = target
        self._open_incident(reason, why, planned=True)
        self._set(JobState.CHECKPOINTING, why)
        self._send(Drain(reason=reason), "drain")

    def request_checkpoint(self: JobSupervisor) -> None:
        self._send(CheckpointNow(reason="operator"), "checkpoint now")

    def request_stop(self: JobSupervisor) -> None:
        """Stop at the next step boundary; with no executor to tell (the job waits for a host,
        an approval, or a lease to run out), it stops before anything else is started."""
        self.stop_requested = True
        if self.link is None:
            self.ctl.journal.record(
                Kind.ACTION,
                f"{self.name}: no executor to tell; it stops before anything is started again",
                job=self.name,
                data={"order": "stop", "delivered": False, "deferred": True},
            )
            self.answer(False)
            self.ctl.fleet.changed.set()  # wakes a supervisor waiting for a host
            return
        self._send(Stop(reason="operator", checkpoint=True), "stop")

    def answer(self: JobSupervisor, approved: bool, target: str | None = None) -> bool:
        if self.approval is None or self.approval.done():
            return False
        self.target = target
        self.approval.set_result(approved)
        return True

    def _send(self: JobSupervisor, msg: ConsoleMessage, order: str) -> None:
        """Send an operator's order; one that cannot be delivered is journalled and alerted as
        such, never taken as done."""
        link = self.link
        if link is None:
            self._undelivered(order, "no executor is linked")
            return
        task = asyncio.get_running_loop().create_task(link.send(msg))

        def sent(t: asyncio.Task[None]) -> None:
            if not t.cancelled() and t.exception() is not None:
                self._undelivered(order, str(t.exception()))

        task.add_done_callback(sent)

    def _undelivered(self: JobSupervisor, order: str, why: str) -> None:
        self.ctl.journal.record(
            Kind.ACTION,
            f"{self.name}: {order} NOT delivered: {why}",
            job=self.name,
            host=self.host,
            data={"order": order, "delivered": False, "error": why},
        )
        self.ctl.alert(f"{order} of {self.name} could not be delivered: {why}", job=self.name)
