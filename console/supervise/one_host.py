"""A job on one host: placed and launched there, its executor watched, recovered by a restart
in place or a failover to a spare.

Example sequences (as in the journal):

- ``A running -> executor SIGKILL -> restart on A (epoch 2) -> running``
- ``A running -> A unreachable -> suspect -> lease ended -> failover to B (epoch 3) -> running``
- ``A running -> drain A -> checkpoint now -> replicate -> B (0 lost steps)``

What every job's supervisor has is ``Supervisor``'s (``console/supervise/supervisor.py``);
this kind adds ``Watch`` (liveness, the lost link), ``Standby`` and ``Twin`` (executors readied
on other hosts), ``SpareKeeper`` and ``Recovery`` (what to do once a run ended).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import TYPE_CHECKING

from console.fleet.link import ExecutorLink, LinkError
from console.records.journal import Kind
from console.spares.placement import choose_primary
from console.spares.spare_keeper import SpareKeeper
from console.states import JobState
from console.supervise.lease import NoAnchor, Unpersisted, fresh_anchor
from console.supervise.outcome import Exit, Outcome
from console.supervise.read_back import NO_CONSOLE
from console.supervise.recovery import Recovery
from console.supervise.standby import Prepared, Standby
from console.supervise.start_lease import granted_start
from console.supervise.twin import Twin
from console.supervise.watch import Watch
from protocol.faults import StopReason
from protocol.messages import ExecutorState, Start

if TYPE_CHECKING:
    from console.supervise.services import JobServices

from console.supervise.supervisor import UNSAVED_RETRY_S, Supervisor

__all__ = ["JobSupervisor"]


class JobSupervisor(Supervisor):
    """A job on one host: its executor watched (``Watch``), readied executors on other hosts
    (``Standby``, ``Twin``), spares kept fit (``SpareKeeper``) and ``Recovery`` once a run
    ended (restart in place, or fail over to a spare)."""

    def __init__(self, services: JobServices, name: str) -> None:
        super().__init__(services, name)
        inv, fleet, journal, store = services.inv, services.fleet, services.journal, services.store
        targets = self._targets
        self._standby = Standby(
            self.live,
            fleet=fleet,
            journal=journal,
            launcher=self.launcher,
            targets=targets,
            probe=self._probe,
            incident=self._incident,
            on_message=lambda msg: self._watch.heard(msg),
        )
        self._twin = Twin(
            self.live,
            launcher=self.launcher,
            journal=journal,
            pump=self._standby.pump,
            pumping=self._standby.pumping,
        )
        self._keeper = keeper = SpareKeeper(
            self.live,
            inv=inv,
            fleet=fleet,
            journal=journal,
            hosts=lambda: [self.live.host] if self.live.host else [],
            send_newest=self._messages.send_newest,
            reserved=self._reserved,
            priorities=self._priorities,
            save=store.save,
            after=self._standby.follow_spares,
        )
        self._watch = Watch(
            self.live,
            states=self._states,
            detection=services.detection,
            policy=services.policy,
            lease=self.lease,
            incident=self._incident,
            standby=self._standby,
            read_back=self._read_back,
            loss=self._loss,
            messages=self._messages,
            leave=self._last_lease.leave,
            keep_spares=keeper.keep,
        )
        self._recovery = Recovery(
            self.live,
            states=self._states,
            incident=self._incident,
            standby=self._standby,
            twin=self._twin,
            targets=targets,
            fleet=fleet,
            journal=journal,
            alert=services.alert,
            save=store.save,
            policy=services.policy,
            restarts=self._restarts,
            wait_for_hosts=services.wait_for_hosts,
            reap=self._probe.reap,
        )

    @property
    def standby(self) -> Prepared | None:
        """The warm standby on the first spare, when the job asks for one."""
        return self._standby.warm

    def hosts_in_use(self) -> list[str]:
        return [self.live.host] if self.live.host else []

    def _preparing(self) -> bool:
        return self._standby.preparing

    def _last_host(self) -> str | None:
        return self.live.rec.host

    def _release(self) -> None:
        self._recovery.release()

    async def _supervise(self) -> None:
        job = self.live
        try:
            nxt = await self._first_launch()
            while not job.state.is_terminal():
                if isinstance(nxt, tuple) and self._stop_before_start():
                    return
                outcome = await self._launch(*nxt) if isinstance(nxt, tuple) else nxt
                if outcome is None:
                    outcome = await self._watch.watch()
                nxt = await self._recovery.recover(outcome)
        finally:
            await self._standby.cancel_warm()

    async def _first_launch(self) -> tuple[str, bool] | Outcome | None:
        """Reattach to a live executor from an earlier console, or say where to start.

        A job's host that cannot be reached is not taken for one whose executor is gone: the
        executor may still be training under the lease the console before this one granted,
        so it is treated as a link lost under that lease (persisted, and waited out).
        """
        job = self.live
        host = job.rec.host
        if host and host in self._fleet.hosts:
            job.host = host
            self._fleet.hosts[host].job = self.name
            self.lease.restore()
            link = self.launcher.link(host)
            try:  # short: an unreachable host is waited out below, not here
                hello = await link.open(timeout=2)
            except LinkError:
                hello = None
            if (
                hello is not None
                and hello.epoch == job.epoch
                and hello.state in (ExecutorState.TRAINING, ExecutorState.STOPPING)
            ):  # stopping: its stop (a preemption's checkpoint, say) is in flight; its Stopped
                # says how the run ended, as to a group's reattach
                job.link, job.step = link, hello.step
                job.last_seen = time.monotonic()
                with contextlib.suppress(LinkError, NoAnchor):  # not granted: the watch renews
                    await link.send(self.lease.renewal(link, host, job.epoch))
                self._note_reattached(host)
                return None
            if (
                hello is None
                and job.epoch > 0
                and await self._probe.wait_gone(host, 2.0) is not True
            ):
                link.close()
                # Never heard from by this console: silent from the start, so probes are cut to
                # what is left of the persisted lease and the target is readied at once.
                job.last_seen = 0.0
                when = "as the job starts again" if self.starting_again else "at console start"
                self._states.move(
                    JobState.PENDING,
                    f"{host} not reachable {when}: waiting out its lease "
                    f"({max(0.0, self.lease.left()):.0f} s left at most)",
                )
                outcome = await self._watch.after_link_loss(
                    f"not reachable {when}", seen_silent=False
                )
                if outcome is None:
                    self._note_reattached(host)
                return outcome
            if (
                hello is not None
                and hello.epoch == job.epoch
                and hello.state == ExecutorState.FAULTED
            ):
                # Its run died while no console watched: restart it in place, as if seen dying.
                job.faulted = link
                job.step = hello.step
                job.last_seen = time.monotonic()
                self._standby.pump(link)
                since = (
                    "the job was started again" if self.starting_again else "this console started"
                )
                return Outcome(Exit.RUN_CRASHED, f"the run on {host} had ended when {since}")
            if hello is not None:
                await self._retire(link, host)
            link.close()
            if hello is None and job.epoch > 0 and not self.starting_again:
                # it ran, and ended with no console to see it: how, its events say (as a
                # group's member gone so), for the recovery to act on: a preemption's stop
                # moves the job, a crash restarts it (counted), a finish finishes it. It was
                # launched on the same host again, one being preempted included, and a
                # checkpoint at its stop was left behind. (A job an operator starts again
                # ended as this console saw: it starts there.)
                outcome = await self._probe.ended(host)
                await self._watch.read_back(outcome, NO_CONSOLE)
                return outcome
            return host, False
        return await self._place()

    def _note_reattached(self, host: str) -> None:
        job = self.live
        hello = job.link.hello if job.link is not None else None
        if job.incident is not None and hello is not None:  # a console restart: nothing lost
            job.resumed_step = hello.step
            # It never stopped: every step it completed is kept, none lost.
            self._incident.phase("loaded", step=hello.step, last_step=hello.step)
        self._journal.record(
            Kind.EXECUTOR,
            f"{self.name}: reattached to executor pid {hello.pid if hello else '?'} on {host}",
            job=self.name,
            host=host,
            data={"pid": hello.pid if hello else None, "epoch": job.epoch},
        )
        self._states.move(JobState.RUNNING, "reattached")
        self._keep_twin()
        self._drain_found()

    async def _place(self) -> tuple[str, bool] | None:
        while True:
            host = choose_primary(
                self._inv,
                self.name,
                usable=self._fleet.usable(),
                reserved=self._reserved(),
                priority=self._priorities(),
            )
            if host is not None:
                return host, False
            if self.live.stop_requested:  # honoured by the caller before any launch: no host
                return "", False
            self._states.wait_note(f"no usable host for {self.name}")
            await self._wait_for_hosts()

    # --------------------------------------------------------------- launch

    async def _launch(self, host: str, promote_replica: bool) -> Outcome | None:
        """Deploy, start and link an executor on ``host`` (unless one was prepared there), then Start it."""
        job = self.live
        self._states.move(JobState.DEPLOYING, f"on {host}")
        self._assign([host])
        link = await self._standby.executor_on(host, promote_replica)
        if isinstance(link, Outcome):
            return link
        if job.stop_requested:  # asked while the executor was readied: it is not Started
            return await self._stopped_before_start(link, host)
        job.rec.epoch += 1
        self._save()
        job.link = link
        self._watch.new_executor()
        job.last_seen = time.monotonic()
        try:
            start = await self._first_lease(link, host)
            if job.stop_requested:  # asked while its lease was being granted
                return await self._stopped_before_start(link, host)
            await link.send(start)
        except LinkError as e:
            return Outcome(Exit.CRASHED, f"executor on {host} went away before Start: {e}")
        self._states.move(JobState.RUNNING, f"on {host}, epoch {job.epoch}")
        if self._inv.jobs[self.name].placement.standby:
            self._standby.keep_warm()
        self._keep_twin()
        return None

    async def _stopped_before_start(self, link: ExecutorLink, host: str) -> Outcome:
        """An operator's stop that came while the job was being launched (its executor started,
        linked, its lease granted): the idle executor is told to go, nothing is Started. It was
        honoured only before the next launch, so a stop during a restart's deploy was lost and
        the job trained on to its end."""
        await self._retire(link, host, why=StopReason.OPERATOR)
        link.close()
        self.live.link = None
        return Outcome(Exit.STOPPED, "stopped by an operator before its start")

    async def _first_lease(self, link: ExecutorLink, host: str) -> Start:
        """The Start, once its lease's bound (with the new epoch) is on disk, granted on a
        fresh reading and granted again if the grant itself spent half of it
        (``granted_start``, one path for every job). While the state cannot be written the job
        waits, its executor idle: nothing trains under an epoch and a lease a console started
        later could not see (an executor gone meanwhile is found when the Start is sent)."""

        async def reading(link: ExecutorLink) -> ExecutorLink:
            await fresh_anchor(link, self.lease.ttl_s)
            return link

        while True:
            try:
                _, start = await granted_start(
                    link,
                    host,
                    job=self.name,
                    ttl_s=self.lease.ttl_s,
                    reading=reading,
                    grant=lambda link: self.lease.start(link, host, self.spec, self.live.epoch),
                    journal=self._journal,
                )
                return start
            except Unpersisted:
                self._states.wait_note(
                    f"{self.name} waits to start on {host}: its lease cannot be persisted"
                )
                await asyncio.sleep(UNSAVED_RETRY_S)

    def _keep_twin(self) -> None:
        if self._inv.jobs[self.name].placement.warm_twin:
            self._twin.keep()

    # ------------------------------------- readied executors (tests drive these)

    async def _start_executor(self, host: str, promote_replica: bool) -> ExecutorLink | Outcome:
        """An idle executor on ``host``, linked and pumped; or why not."""
        return await self._standby.start(host, promote_replica)

    async def _prepare_failover(self, old: str) -> Prepared | None:
        return await self._standby.prepare_failover(old)

    async def _discard(self, prepared: Prepared) -> None:
        await self._standby.discard(prepared)
