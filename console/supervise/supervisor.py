"""What every job's supervisor has (``GroupSupervisor``, ``group/supervisor.py``: a job on one
host is a group of one; issue 30 made the two supervisors one).

Given ``JobServices`` (what it may use of the fleet-wide controller, ``services.py``), it
builds the pieces both kinds use, each handed the shared ``LiveJob`` and only what else it
needs (never the services, never this): ``JobLease``, ``OpenIncident``, ``Probe``,
``Launcher``, ``LinkLoss`` (what a lost link means), ``Orders`` (an operator's requests),
``JobMessages`` and ``Observe`` (a read-only console's view); and it begins every run the same
way (a job finished or stopped before this console started goes nowhere).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Generic, TypeVar, overload

from console.fleet.link import ExecutorLink, LinkError
from console.reach.transport.base import Transport
from console.records.journal import Kind
from console.records.state_store import JobRecord
from console.spares.placement import choose_spares
from console.spares.targets import Targets
from console.states import FailureKind, HostState, JobState
from console.supervise.group.commit import Commits
from console.supervise.incident import OpenIncident
from console.supervise.launcher import Launcher
from console.supervise.lease import JobLease
from console.supervise.leave import LastLease
from console.supervise.link_loss import LinkLoss
from console.supervise.live import LiveJob, Transitions
from console.supervise.member import Member
from console.supervise.messages import JobMessages
from console.supervise.observe import Observe
from console.supervise.orders import Orders
from console.supervise.probe import Probe
from console.supervise.read_back import ReadBack
from console.supervise.restart import RestartBudget
from console.supervise.standby import Prepared
from protocol.faults import StopReason
from protocol.messages import ExecutorState, Progress, Stop
from protocol.spec import CheckpointManifest

if TYPE_CHECKING:
    from console.supervise.services import JobServices

__all__ = ["Prepared", "Supervisor"]

UNSAVED_RETRY_S = 0.5
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
    job finished or stopped before this console started goes nowhere). What follows is
    ``GroupSupervisor``'s (one executor per member; a job on one host has one member)."""

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
        self._placement_said: tuple[tuple[str, ...], tuple[str, ...]] | None = None
        """The hosts and spares last journalled (``_assign``): said once, not at each launch."""
        c = inv.console
        self.lease = JobLease(
            rec, store.persist, ttl_s=c.lease_s, skew_s=c.clock_skew_s, vouch=store.vouch
        )

        self._states = Transitions(
            self.live, journal=journal, alert=services.alert, alerted=services.alerted
        )
        self._incident = OpenIncident(self.live, log=services.incidents, preparing=self._preparing)
        self._restarts = RestartBudget(
            self.live,
            states=self._states,
            incident=self._incident,
            save=store.save,
            limit=c.restart_limit,
        )
        """Restarts in place left, one budget whichever kind the job is."""

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
            cleanups=services.cleanups,
        )
        self._last_lease = LastLease(
            self.live,
            lease=self.lease,
            dial=self.launcher.link,
            unattended_s=c.unattended_s,
            journal=journal,
        )
        """A clean quit's last lease to every executor still training (one path for both)."""
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
        self._targets = Targets(
            self.live, inv=inv, fleet=fleet, replicator=services.replicator, reserved=self._reserved
        )
        """Where the job goes when it leaves a host: one choice whichever kind the job is."""
        self.dismissed = self.launcher.dismissed
        """(host, pid) of executors told they are not needed (see Launcher.dismissed)."""
        self._orders = Orders(
            self.live,
            states=self._states,
            incident=self._incident,
            journal=journal,
            alert=services.alert,
            wake=fleet.changed.set,
            hosts=self.hosts_in_use,
        )
        commits = self._checkpoint_commits(rec, store.save)
        self._messages = JobMessages(  # one dispatcher, whichever kind; a read-only view too
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
            move=self._move_rank,
            members=self.hosts_in_use,
            commits=None if services.read_only else commits,
            refused=self._refused,
            acts=not services.read_only,
        )

        self._read_back = ReadBack(
            self.live, messages=self._messages, ended=self._probe.ended, journal=journal
        )
        """A checkpoint an executor wrote that its link never delivered, read from its events."""

        async def look(rec: JobRecord) -> None:
            await services.replicator.look(name, rec.spares, self.shards())

        self._observe = Observe(
            self.live,
            record=lambda: store.job(name),
            fleet=fleet,
            link=self.launcher.link,
            on_message=lambda msg: self._messages.on_message(self._rank0(), msg),
            look=look,
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
        """The warm standby on the first spare, when the job keeps one."""
        return None

    @abstractmethod
    def hosts_in_use(self) -> list[str]:
        """The hosts the job trains on now (one; a multi-host job's members)."""
        raise NotImplementedError

    def shards(self) -> list[int | None]:
        """What the job's checkpoints replicate as (the ``Replicator``'s shards): one host's,
        whole (None); a group's, each member's shard by node rank, whatever its size (an
        elastic group shrunk to one member still has shard 0, not a whole checkpoint)."""
        return [None]

    def _checkpoint_commits(self, rec: JobRecord, save: Callable[[], object]) -> Commits | None:
        """What makes a written checkpoint the job's: None, its being written (one host's is
        whole); a group's two-phase commit (every member's shard of the step written)."""
        return None

    def _rank0(self) -> Member:
        """The executor the job's link reaches, as node rank 0 (a single host's, a group's
        first member's: what a read-only console watches)."""
        job = self.live
        return Member(0, job.host or "", link=job.link, last_seen=job.last_seen)

    def _move_rank(self, m: Member, reason: StopReason, why: str) -> None:
        """``m``'s GPU fails a health rule: the job moves off its host (0 lost steps)."""
        self._orders.request_move(reason, why)

    def _refused(self, host: str, step: int) -> None:
        """A member on ``host`` could not load ``step`` (a group's: its next resume chooses
        another)."""
        return

    def _preparing(self) -> bool:
        """Whether an executor is being readied on a failover's target (its incident says so)."""
        return False

    # ------------------------------------------------------------- requests

    def _trained(self, msg: Progress) -> None:
        """A step trained: the controller is told, and a move kept meanwhile is made."""
        self._services.on_progress(self, msg)
        self._orders.trains()

    def request_move(
        self, reason: StopReason, why: str, target: str | None = None, off: str | None = None
    ) -> None:
        """Planned migration: checkpoint at the current step, stop, then move (0 lost steps);
        ``off``: the host the job is to leave (kept until it trains, moot if it left it)."""
        self._orders.request_move(reason, why, target, off)

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

    async def _retire(
        self, link: ExecutorLink, host: str, why: StopReason = StopReason.NOT_NEEDED
    ) -> None:
        """An executor this console will not Start (idle, or of another epoch): stop it, wait
        for its lock."""
        if link.hello is not None:
            self.dismissed.add((host, link.hello.pid))
        with contextlib.suppress(LinkError):
            await link.send(Stop(reason=why, checkpoint=False))
        await self._probe.wait_gone(host)

    def _assign(self, hosts: list[str]) -> None:
        """The job trains on ``hosts`` now (one, or a group's members by node rank): they are
        its and the hosts it left are free. Its spares are kept where still fit and free (they
        hold its replicas), and filled up to the count it asks for (its named spares first,
        then the nearest: ``choose_spares``); journalled, alerted when it has none.

        One rule for both kinds (issue 30): a single host's job chose its spares afresh at each
        launch, dropping a spare that held its replicas for another ranked higher; a group kept
        its spares, and chose only once none was left."""
        job, fleet = self.live, self._fleet
        for h, rt in fleet.hosts.items():
            if rt.job == self.name and h not in hosts:
                fleet.free(h, self.name, f"{self.name} left it")
        for h in hosts:
            fleet.hosts[h].job = self.name
        job.host = hosts[0]
        wanted = max(1, len(self._inv.jobs[self.name].placement.spares))
        usable = fleet.usable()  # fit and free: never one of ``hosts``, taken just above
        kept = [s for s in job.spares if s in usable][:wanted]
        if len(kept) < wanted:
            choice = choose_spares(
                self._inv,
                self.name,
                hosts[0],
                usable=usable - set(kept),
                reserved=self._reserved(),
                priority=self._priorities(),
                count=wanted - len(kept),
            )
            for spare, other in choice.taken:
                self._take_spare(spare, other, by=self.name)
            kept += choice.spares
        job.spares = kept
        job.rec.host, job.rec.spares = hosts[0], list(kept)
        self._save()
        said = (tuple(hosts), tuple(kept))
        if said == self._placement_said:  # the launch after a recovery's move: said then
            return
        self._placement_said = said
        ranks = f" (node ranks 0..{len(hosts) - 1})" if len(hosts) > 1 else ""
        self._journal.record(
            Kind.PLACEMENT,
            f"{self.name}: on {', '.join(hosts)}{ranks}, spares {', '.join(kept) or 'none'}",
            job=self.name,
            host=hosts[0],
            data={"members": list(hosts), "spares": list(kept)},
        )
        if not kept:
            self._alert(
                f"job {self.name} has no spare: a host failure will wait for one", job=self.name
            )
            self._need_host(f"job {self.name} has no spare")

    def _drain_found(self) -> None:
        """Reattached to a run on a host found draining (or drained) at console start: the
        console before this one drained it and died before the job was told, or before its
        move was made. The move is asked for now (0 lost steps), as a drain would have; a run
        found stopping already says how it ends."""
        hello = self.live.link.hello if self.live.link is not None else None
        if hello is not None and hello.state is ExecutorState.STOPPING:
            return
        for host in self.hosts_in_use():
            state = self._fleet.hosts[host].state
            if state in (HostState.DRAINING, HostState.DRAINED):
                self.request_move(
                    StopReason.DRAIN, f"{host} was {state.value} when this console started"
                )
                return

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
