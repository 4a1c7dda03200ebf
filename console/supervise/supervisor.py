"""One job's life: launch on a host, watch it, and recover by restart or failover.

Example sequences (as in the journal):

- ``A running -> executor SIGKILL -> restart on A (epoch 2) -> running``
- ``A running -> A unreachable -> suspect -> lease ended -> failover to B (epoch 3) -> running``
- ``A running -> drain A -> checkpoint now -> replicate -> B (0 lost steps)``

``Supervisor`` is what every job's supervisor has, one host or a group (``GroupSupervisor``,
``console/supervise/group``): given ``JobServices`` (what it may use of the fleet-wide controller,
``console/supervise/services``), it builds the pieces both kinds use, each handed the shared
``LiveJob`` and only what else it needs (never the services, never this): ``JobLease``,
``OpenIncident``, ``Probe``, ``Launcher``, ``LinkLoss`` (what a lost link means), ``Orders``
(an operator's requests), ``JobMessages`` and ``Observe`` (a read-only console's view); and it
begins every run the same way. ``JobSupervisor`` (one host) places and launches the job, and
adds ``Watch`` (liveness, the lost link), ``Standby`` and ``Twin`` (executors readied on other
hosts), ``SpareKeeper`` and ``Recovery`` (what to do once a run ended).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from abc import ABC, abstractmethod
from collections import deque
from typing import TYPE_CHECKING, Generic, TypeVar, overload

from console import clock
from console.fleet.link import ExecutorLink, LinkError
from console.reach.transport.base import Transport
from console.records.journal import Kind
from console.records.state_store import JobRecord
from console.spares.placement import choose_primary, choose_spares
from console.spares.spare_keeper import SpareKeeper
from console.spares.targets import Targets
from console.states import FailureKind, JobState
from console.supervise.incident import OpenIncident
from console.supervise.launcher import Launcher
from console.supervise.lease import JobLease, NoAnchor, Unpersisted, fresh_anchor
from console.supervise.link_loss import LinkLoss
from console.supervise.live import LiveJob, Transitions
from console.supervise.messages import JobMessages
from console.supervise.observe import Observe
from console.supervise.orders import Orders
from console.supervise.outcome import Exit, Outcome
from console.supervise.probe import Probe
from console.supervise.recovery import Recovery
from console.supervise.standby import Prepared, Standby
from console.supervise.twin import Twin
from console.supervise.watch import Watch
from protocol.messages import ExecutorState, Progress, Start, Stop
from protocol.spec import CheckpointManifest

if TYPE_CHECKING:
    from console.supervise.services import JobServices

__all__ = ["JobSupervisor", "Prepared", "Supervisor"]

UNSAVED_RETRY_S = 0.5
REGRANTS = 3
"""How many times a Start's lease found half spent by its own grant is granted afresh."""
"""How often a Start held back by a state that cannot be saved is tried again."""

T = TypeVar("T")


class _Live(Generic[T]):
    """A supervisor attribute that is its ``LiveJob``'s (what the console's views read)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name

    @overload
    def __get__(self, sup: None, owner: type | None = None) -> _Live[T]: ...
    @overload
    def __get__(self, sup: Supervisor, owner: type | None = None) -> T: ...
    def __get__(self, sup: Supervisor | None, owner: type | None = None) -> T | _Live[T]:
        return self if sup is None else getattr(sup.live, self._name)

    def __set__(self, sup: Supervisor, value: T) -> None:
        setattr(sup.live, self._name, value)


class Supervisor(ABC):
    """What every job's supervisor has, one host or a group: the job's live view, its lease,
    its state moves, its incident, the probe of its hosts, its launcher, the classifier of a
    lost link, an operator's orders and a read-only console's view; the run's beginning (a
    job finished or stopped before this console started goes nowhere). What follows is the
    kind's: ``JobSupervisor`` (one host) or ``GroupSupervisor`` (one executor per member)."""

    rec: _Live[JobRecord] = _Live()
    failure: _Live[FailureKind | None] = _Live()
    why: _Live[str] = _Live()
    host: _Live[str | None] = _Live()
    spares: _Live[list[str]] = _Live()
    link: _Live[ExecutorLink | None] = _Live()
    last_seen: _Live[float] = _Live()
    step: _Live[int] = _Live()
    loss: _Live[float] = _Live()
    steps_per_s: _Live[float] = _Live()
    checkpoint: _Live[CheckpointManifest | None] = _Live()
    history: _Live[deque[tuple[float, int, float, float]]] = _Live()
    checkpoints: _Live[deque[tuple[str, CheckpointManifest]]] = _Live()
    log_tail: _Live[deque[str]] = _Live()
    incident: _Live[int | None] = _Live()
    resumed_step: _Live[int | None] = _Live()
    sha256: _Live[str | None] = _Live()
    approval: _Live[asyncio.Future[bool] | None] = _Live()
    stop_requested: _Live[bool] = _Live()

    @property
    def awaiting_approval(self) -> bool:
        return self.live.awaiting_approval

    def __init__(self, services: JobServices, name: str) -> None:
        inv, fleet, journal, store = services.inv, services.fleet, services.journal, services.store
        self._services = services
        self.name = name
        self.spec = inv.jobs[name].spec
        rec = store.job(name)
        self.live = LiveJob(
            name, self.spec, rec, spares=list(rec.spares), sha256=rec.finished_sha256
        )
        self._read_only = services.read_only
        self.starting_again = False
        """Made by an operator's start of a stopped or failed job, not at console start (what
        its first launch finds is said as such)."""
        self._inv = inv
        self._fleet = fleet
        self._journal = journal
        self._save = store.save
        self._alert = services.alert
        self._reserved = functools.partial(services.reserved, name)
        self._priorities = services.priorities
        self._take_spare = services.take_spare
        self._wait_for_hosts = services.wait_for_hosts
        self._need_host = services.need_host
        c = inv.console
        self.lease = JobLease(
            rec, store.persist, ttl_s=c.lease_s, skew_s=c.clock_skew_s, vouch=store.vouch
        )

        self._states = Transitions(
            self.live, journal=journal, alert=services.alert, alerted=services.alerted
        )
        self._incident = OpenIncident(self.live, log=services.incidents, preparing=self._preparing)

        def transport(host: str) -> Transport:
            return fleet.hosts[host].transport  # read when used: a host's transport may change

        self._probe = Probe(
            name, inv=inv, transport=transport, journal=journal, alert=services.alert
        )
        self.launcher = Launcher(
            name,
            inv=inv,
            transport=transport,
            journal=journal,
            phase=self._incident.phase,
            console_id=services.console_id,
            term=services.term,
            executor_env=services.executor_env,
            ended=self._probe.ended,
        )
        self._loss = LinkLoss(
            name,
            hosts=fleet,
            probe=self._probe,
            detection=services.detection,
            heartbeat_s=c.heartbeat_s,
            link=self.launcher.link,
            alert=services.alert,
        )
        """What a lost link to one of the job's executors means (single host or member)."""
        self.dismissed = self.launcher.dismissed
        """(host, pid) of executors told they are not needed (see Launcher.dismissed)."""
        self._orders = Orders(
            self.live,
            states=self._states,
            incident=self._incident,
            journal=journal,
            alert=services.alert,
            wake=fleet.changed.set,
        )
        self._job_messages = JobMessages(  # a single host's messages; any job's read-only view
            self.live,
            inv=inv,
            fleet=fleet,
            journal=journal,
            alert=services.alert,
            policy=services.policy,
            lease=self.lease,
            save=store.save,
            replicator=services.replicator,
            incident=self._incident,
            progress=self._trained,
            move=self._orders.request_move,
            acts=not services.read_only,
        )
        self._observe = Observe(
            self.live,
            record=lambda: store.job(name),
            fleet=fleet,
            link=self.launcher.link,
            on_message=self._job_messages.on_message,
        )

    # ---------------------------------------------------------------- state

    @property
    def state(self) -> JobState:
        return self.live.state

    @property
    def epoch(self) -> int:
        return self.live.epoch

    @property
    def standby(self) -> Prepared | None:
        """The warm standby on the first spare, when the job asks for one (one host only)."""
        return None

    @abstractmethod
    def hosts_in_use(self) -> list[str]:
        """The hosts the job trains on now (one; a multi-host job's members)."""
        raise NotImplementedError

    def _preparing(self) -> bool:
        """Whether an executor is being readied on a failover's target (its incident says so)."""
        return False

    # ------------------------------------------------------------- requests

    def _trained(self, msg: Progress) -> None:
        """A step trained: the controller is told, and a move kept meanwhile is made."""
        self._services.on_progress(self, msg)
        self._orders.trains()

    def request_move(self, reason: str, why: str, target: str | None = None) -> None:
        """Planned migration: checkpoint at the current step, stop, then move (0 lost steps)."""
        self._orders.request_move(reason, why, target)

    def request_checkpoint(self) -> None:
        self._orders.request_checkpoint()

    def request_stop(self) -> None:
        self._orders.request_stop()

    def answer(self, approved: bool, target: str | None = None) -> bool:
        return self._orders.answer(approved, target)

    # ------------------------------------------------------------------ run

    async def run(self) -> None:
        job = self.live
        if self._read_only:
            await self._observe.observe()
            return
        if job.rec.finished:
            job.step = job.rec.finished_step or self.spec.steps
            job.host = self._last_host()
            self._states.move(JobState.FINISHED, "finished before this console started")
            return
        if job.rec.stopped:
            self._states.stopped("stopped by an operator before this console started")
            return
        await self._supervise()

    @abstractmethod
    def _last_host(self) -> str | None:
        """The host a job finished before this console started is shown on (rank 0's)."""
        raise NotImplementedError

    @abstractmethod
    async def _supervise(self) -> None:
        """Launch (or reattach), watch and recover until the job's state is terminal."""
        raise NotImplementedError

    @abstractmethod
    def _release(self) -> None:
        """The job is over: its hosts and spares are free."""
        raise NotImplementedError

    async def _retire(self, link: ExecutorLink, host: str) -> None:
        """An executor this console cannot adopt (idle, or of another epoch): stop it, wait for its lock."""
        if link.hello is not None:
            self.dismissed.add((host, link.hello.pid))
        with contextlib.suppress(LinkError):
            await link.send(Stop(reason="not adopted by the console", checkpoint=False))
        await self._probe.wait_gone(host)

    def _stop_before_start(self) -> bool:
        """An operator's stop that found no executor to tell is honoured here, before any start."""
        job = self.live
        if not job.stop_requested:
            return False
        job.rec.stopped = True
        self._save()
        self._states.fail(FailureKind.STOPPED, "stopped by an operator")
        self._release()
        return True

    async def _until_saved(self, why: str) -> None:
        """Until the state is on disk: while it cannot be written (a full disk) the job waits,
        pending, ``why`` its note (the store's retry and alert are the console's)."""
        while not self._save():
            self._states.wait_note(why)
            await asyncio.sleep(UNSAVED_RETRY_S)


class JobSupervisor(Supervisor):
    """A job on one host: its executor watched (``Watch``), readied executors on other hosts
    (``Standby``, ``Twin``), spares kept fit (``SpareKeeper``) and ``Recovery`` once a run
    ended (restart in place, or fail over to a spare)."""

    def __init__(self, services: JobServices, name: str) -> None:
        super().__init__(services, name)
        inv, fleet, journal, store = services.inv, services.fleet, services.journal, services.store
        c = inv.console
        targets = Targets(
            self.live, inv=inv, fleet=fleet, replicator=services.replicator, reserved=self._reserved
        )
        self._standby = Standby(
            self.live,
            fleet=fleet,
            journal=journal,
            launcher=self.launcher,
            targets=targets,
            probe=self._probe,
            incident=self._incident,
            on_message=self._job_messages.on_message,
        )
        self._twin = Twin(
            self.live,
            launcher=self.launcher,
            journal=journal,
            pump=self._standby.pump,
            pumping=self._standby.pumping,
        )
        keeper = SpareKeeper(
            self.live,
            inv=inv,
            fleet=fleet,
            journal=journal,
            replicator=services.replicator,
            reserved=self._reserved,
            priorities=self._priorities,
            save=store.save,
            after=self._standby.follow_spares,
        )
        self._watch = Watch(
            self.live,
            states=self._states,
            inv=inv,
            journal=journal,
            detection=services.detection,
            policy=services.policy,
            lease=self.lease,
            incident=self._incident,
            standby=self._standby,
            probe=self._probe,
            loss=self._loss,
            messages=self._job_messages,
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
            restart_limit=c.restart_limit,
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
                and hello.state == ExecutorState.TRAINING
            ):
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

    def _assign(self, host: str) -> None:
        job, fleet = self.live, self._fleet
        if job.host and job.host != host and fleet.hosts[job.host].job == self.name:
            fleet.hosts[job.host].job = None
        job.host = host
        fleet.hosts[host].job = self.name
        choice = choose_spares(
            self._inv,
            self.name,
            host,
            usable=fleet.usable(),
            reserved=self._reserved(),
            priority=self._priorities(),
            count=max(1, len(self._inv.jobs[self.name].placement.spares)),
        )
        for spare, other in choice.taken:
            self._take_spare(spare, other, by=self.name)
        job.spares = choice.spares
        job.rec.host, job.rec.spares = host, list(choice.spares)
        self._save()
        self._journal.record(
            Kind.PLACEMENT,
            f"{self.name}: on {host}, spares {', '.join(job.spares) or 'none'}",
            job=self.name,
            host=host,
            data={"spares": job.spares},
        )
        if not job.spares:
            self._alert(
                f"job {self.name} has no spare: a host failure will wait for one", job=self.name
            )
            self._need_host(f"job {self.name} has no spare")

    async def _launch(self, host: str, promote_replica: bool) -> Outcome | None:
        """Deploy, start and link an executor on ``host`` (unless one was prepared there), then Start it."""
        job = self.live
        self._states.move(JobState.DEPLOYING, f"on {host}")
        self._assign(host)
        link = await self._standby.executor_on(host, promote_replica)
        if isinstance(link, Outcome):
            return link
        job.rec.epoch += 1
        self._save()
        job.link = link
        self._watch.new_executor()
        job.last_seen = time.monotonic()
        try:
            await link.send(await self._first_lease(link, host))
        except LinkError as e:
            return Outcome(Exit.CRASHED, f"executor on {host} went away before Start: {e}")
        self._states.move(JobState.RUNNING, f"on {host}, epoch {job.epoch}")
        if self._inv.jobs[self.name].placement.standby:
            self._standby.keep_warm()
        self._keep_twin()
        return None

    async def _first_lease(self, link: ExecutorLink, host: str) -> Start:
        """The Start, once its lease's bound (with the new epoch) is on disk. While the state
        cannot be written the job waits, its executor idle: nothing trains under an epoch and
        a lease a console started later could not see (an executor gone meanwhile is found
        when the Start is sent). A grant that took half a lease itself (the state's write on
        a slow disk: its reading was fresh, the lease it bounds is then half spent) is made
        again on a new reading, up to ``REGRANTS`` times, then sent as it is."""
        regrants = 0
        while True:
            await fresh_anchor(link, self.lease.ttl_s)
            used = link.anchor
            try:
                start = self.lease.start(link, host, self.spec, self.live.epoch)
            except Unpersisted:
                self._states.wait_note(
                    f"{self.name} waits to start on {host}: its lease cannot be persisted"
                )
                await asyncio.sleep(UNSAVED_RETRY_S)
                continue
            spent = clock.mono() - used[1] if used is not None else 0.0
            if spent <= self.lease.ttl_s / 2 or regrants >= REGRANTS:
                return start
            regrants += 1
            self._journal.record(
                Kind.ACTION,
                f"{self.name}: the Start's lease on {host} was {spent:.2f} s spent when granted "
                f"(of {self.lease.ttl_s:g} s): granted again on a new reading",
                job=self.name,
                host=host,
                data={"spent_s": round(spent, 3), "regrant": regrants},
            )

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
