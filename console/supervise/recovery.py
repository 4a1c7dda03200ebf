"""What a single host's job does once its executor's run has ended: what ``what_next`` says (the
one decision of every job), carried out with what a single host readies (the executor that
stayed, its warm twin, a standby on the spare).

transient -> relink (in watch); executor crash or hang -> restart in place up to N times;
host lost, GPU FAIL, drain, preemption, a move -> fail over (same region first); a planned
stop on a host still fit -> restart there; config -> fail fast.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from console.fleet.hosts import Fleet
from console.fleet.link import ExecutorLink
from console.records.journal import Journal, Kind
from console.spares.targets import Targets
from console.states import FailureKind, HostState, JobState
from console.supervise.approval import approved
from console.supervise.finish import finish, last_step, release
from console.supervise.incident import OpenIncident, preempted_why
from console.supervise.live import Alert, LiveJob, Transitions
from console.supervise.outcome import CRASHES, RESTART_IN_PLACE, Exit, Outcome
from console.supervise.policy import Policy
from console.supervise.restart import RestartBudget
from console.supervise.standby import Prepared, Standby
from console.supervise.twin import Twin
from console.supervise.unless_down import HostLost, unless_down
from console.supervise.what_next import Act, Next, budgeted, unfit, what_next


class Recovery:
    """Recovery decisions once a run has ended: finish, fail, restart in place or fail over."""

    def __init__(
        self,
        live: LiveJob,
        *,
        states: Transitions,
        incident: OpenIncident,
        standby: Standby,
        twin: Twin,
        targets: Targets,
        fleet: Fleet,
        journal: Journal,
        alert: Alert,
        save: Callable[[], object],
        policy: Callable[[], Policy],
        restarts: RestartBudget,
        wait_for_hosts: Callable[[], Awaitable[None]],
        reap: Callable[[str], Awaitable[bool]] | None = None,
    ) -> None:
        self._live = live
        self._states = states
        self._incident = incident
        self._standby = standby
        self._twin = twin
        self._targets = targets
        self._fleet = fleet
        self._journal = journal
        self._alert = alert
        self._save = save
        """Persist the job's record."""
        self._policy = policy
        self._restarts = restarts
        self._wait_for_hosts = wait_for_hosts
        """Until the fleet may have a usable host again (or a while has passed)."""
        self._reap = reap
        """Kill what is left of the run on a host the console can reach (``Probe.reap``)."""

    # ---------------------------------------------------------------- recover

    async def recover(self, outcome: Outcome) -> tuple[str, bool] | None:
        """Act on how a run ended (``what_next``); returns where to launch next (host, promote a
        replica), or None."""
        job = self._live
        host = job.host
        faulted, job.faulted = job.faulted, None
        if outcome.exit is not Exit.HOST_LOST:
            await self._standby.cancel_preparation()
        said = (
            f"{job.name}: the run on {host} ended, its executor stays: {outcome.said()}"
            if outcome.exit is Exit.RUN_CRASHED and faulted is not None
            else f"{job.name}: executor on {host} ended: {outcome.said()}"
        )
        self._journal.record(
            Kind.EXECUTOR,
            said,
            job=job.name,
            host=host,
            data={"exit": outcome.exit.value, "step": outcome.step},
        )
        why_not = unfit(self._fleet, host, outcome, job.leave) if host is not None else None
        decision = what_next([outcome], 0, stop_requested=job.stop_requested, unfit=[why_not])
        if decision.act in (Act.FINISH, Act.CONFIG, Act.STOP):
            await self._over(decision, outcome, host, faulted)
            return None
        assert host is not None
        if decision.act is Act.RESTART and not decision.planned:
            self._incident.open(outcome.exit.value, outcome.why)
        decision = budgeted(decision, self._restarts, host, outcome.why, last_step(job, [outcome]))
        if decision.act is Act.RESTART:
            if not await self._approved(outcome, f"a restart on {host}", failover=False):
                await self._drop_readied(host, faulted)
                return None
            return self._restart(decision, outcome, host, faulted)
        if decision.act is Act.CRASH_LOOP:
            await self._over(decision, outcome, host, faulted)
            return None
        if outcome.exit in RESTART_IN_PLACE:
            self._journal.record(
                Kind.ACTION,
                f"{job.name}: not restarted on {host}: {decision.why}; failing over",
                job=job.name,
                host=host,
            )
        return await self._leave(outcome, host, faulted)

    async def _over(
        self, decision: Next, outcome: Outcome, host: str | None, faulted: ExecutorLink | None
    ) -> None:
        """The job is over (finished, its configuration bad, stopped, or crash-looping):
        nothing readied for it stays."""
        job = self._live
        await self._drop_readied(host, faulted)
        if decision.act is Act.FINISH:
            finish(
                job,
                step=outcome.step or job.step,
                sha256=outcome.sha256 or "",
                warnings=list(outcome.warnings),
                host=host,
                members=None,
                states=self._states,
                journal=self._journal,
                alert=self._alert,
                save=self._save,
            )
        elif decision.act is Act.CONFIG:
            self._states.fail(FailureKind.CONFIG, outcome.why)
        elif decision.act is Act.CRASH_LOOP:
            self._states.fail(FailureKind.CRASH_LOOP, decision.why)
        else:
            if job.stop_requested:  # an operator's stop, not an executor's own
                job.rec.stopped = True
                self._save()
            own = outcome.exit is Exit.STOPPED or not job.stop_requested
            self._states.fail(FailureKind.STOPPED, outcome.why if own else "stopped by an operator")
        self.release()

    async def _drop_readied(self, host: str | None, faulted: ExecutorLink | None) -> None:
        """Nothing readied for a job that is over stays: its warm standby, its twin, the
        executor whose run ended and that waits."""
        await self._standby.drop_warm()
        await self._twin.drop()
        if faulted is not None and host is not None:
            await self._standby.discard(Prepared(host, faulted))

    async def _approved(self, outcome: Outcome, what: str, *, failover: bool) -> bool:
        """Whether the policy lets the recovery go ahead (``approval.approved``): a failover
        after a fault asks under manual; under observe every recovery waits for an operator."""
        job = self._live
        return await approved(
            job,
            policy=self._policy(),
            states=self._states,
            alert=self._alert,
            save=self._save,
            release=self.release,
            end=outcome,
            asks=f"{job.name} needs {what} ({outcome.why})",
            failover=failover,
        )

    def _restart(
        self, decision: Next, outcome: Outcome, host: str, faulted: ExecutorLink | None
    ) -> tuple[str, bool]:
        """Again on ``host``: a crash's restart (its budget taken) by a Start to the executor
        that stayed, or by its warm twin, or by a new executor; a planned stop on a host still
        fit (a Ctrl-C of the executor: SIGINT says nothing of its host) by a new executor, for
        free."""
        job = self._live
        if decision.planned:
            self._planned(outcome, host)
            self._states.move(JobState.RESTARTING, f"planned stop: restarting on {host}")
            self._incident.phase(
                "decided", action="restart", host=host, last_step=last_step(job, [outcome])
            )
        elif faulted is not None:  # the executor waits: the restart is a Start, in place
            self._standby.prepared = Prepared(host, faulted, promoted=True)
        elif outcome.exit in (*CRASHES, Exit.HUNG) and (twin := self._twin.take(host)) is not None:
            # the executor's process is gone (its lock seen free, or killed as hung): the warm
            # twin takes over in its own process (it refuses if the lock is held after all)
            self._standby.prepared = Prepared(host, twin, promoted=True)
        return host, False

    def _planned(self, outcome: Outcome, host: str) -> None:
        """The incident of a planned stop (a preemption's, if its Fault came too late)."""
        if outcome.preempted:  # its Fault not read before the link closed: the same incident
            self._incident.open("preemption", preempted_why(host), planned=True)
        elif outcome.exit is Exit.PLANNED:
            self._incident.open("planned", outcome.why, planned=True)

    async def _leave(
        self, outcome: Outcome, host: str, faulted: ExecutorLink | None
    ) -> tuple[str, bool] | None:
        """The job leaves ``host``: what it readied there goes, the host is marked as the end
        says (down, drained), the old run is reaped, and the job fails over."""
        job, fleet = self._live, self._fleet
        await self._twin.drop()  # not restarted on this host: no twin lingers there
        if faulted is not None:  # not restarted there: it must not wait out its lease
            await self._standby.discard(Prepared(host, faulted))
        if outcome.exit is Exit.HOST_LOST:
            self._incident.open("host_lost", outcome.why)
            fleet.set_state(host, HostState.DOWN, outcome.why)
        self._planned(outcome, host)
        job.leave.pop(host, None)
        if (
            outcome.exit is not Exit.HOST_LOST
            and self._reap is not None
            and fleet.hosts[host].state is not HostState.DOWN
        ):
            await self._reap(host)  # the old run gone before the next epoch trains anywhere
        return await self._failover(outcome)

    def release(self) -> None:
        """The job is over: every host it held is free (``finish.release``)."""
        release(self._live, self._fleet)

    # --------------------------------------------------------------- failover

    async def _failover(self, outcome: Outcome) -> tuple[str, bool] | None:
        job, fleet, standby = self._live, self._fleet, self._standby
        old = job.host
        self._states.move(JobState.FAILING_OVER, outcome.why)
        planned = outcome.exit is Exit.PLANNED  # a move planned: it goes ahead under manual
        if not await self._approved(outcome, f"a failover off {old}", failover=not planned):
            return None
        if old is not None:
            fleet.free(old, job.name, f"{job.name} left it")
        # a host lost may be chosen again once it is back; one the job leaves up (a crash past
        # the restart limit, a preemption, a drain) is not
        back = old is not None and fleet.hosts[old].state is HostState.DOWN
        target = await standby.take_prepared(old)
        while True:
            while target is None:
                target = await self._targets.pick(old, back=back)
                if target is not None or job.stop_requested:
                    break
                self._states.wait_note(f"no spare left for {job.name}: it waits for a host")
                await self._wait_for_hosts()
            job.target = None
            if target is None:  # an operator stopped the job while it waited for a host
                return old or "", False
            job.rec.restarts = 0
            self._incident.phase(
                "decided", action="failover", host=target, last_step=last_step(job, [outcome])
            )
            prepared = standby.prepared
            if prepared is not None and prepared.host == target and prepared.promoted:
                return target, False
            # the newest checkpoint (a planned move's: the one at its stop) goes to the target
            # only, once it is chosen: a copy to a spare that is not the target (one that died
            # with the fault, say) would hold up the move for nothing
            try:
                copied = await unless_down(fleet, target, self._targets.ensure_replica(target))
            except HostLost:  # a fault during the recovery: the target was found down
                why = "was lost"
            else:
                if not fleet.hosts[target].leaving:
                    break
                why = "is being released"
            self._journal.record(
                Kind.ACTION,
                f"{job.name}: {target} {why} while the failover readied it; choosing again",
                job=job.name,
                host=target,
            )
            fleet.free(target, job.name, f"{job.name} readied it for nothing")
            standby.prepared = None
            target = None
        if not copied and outcome.exit is Exit.PLANNED and job.checkpoint is not None:
            self._alert(
                f"{job.name}: the checkpoint at the stop (step {job.checkpoint.step}) did not "
                f"reach {target}; it resumes from an older replica and loses steps",
                job=job.name,
            )
        return target, True
