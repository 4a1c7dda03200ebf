"""Every job's supervisor (issue 30: one supervisor; a job on one host is a group of one,
keeping one host's replica layout and journal wording): start every member at one epoch, watch
them, and when any member's run ends, restart the group at a new epoch, same world size and
rank order, from the newest step every member committed, a lost member's host replaced by a
spare.

Example for one host: ``a running -> a unreachable -> its lease waited out -> b (a spare,
its executor readied meanwhile; replica promoted) at epoch 2 from step 40 -> running``.

Example sequence (as in the journal): ``a, b, c running (epoch 1) -> c unreachable -> its
lease waited out -> c replaced by d (shard of step 40 promoted there) -> a, b (in place,
torch warm), d at epoch 2 from step 40 -> running``.

Given ``JobServices`` (what it may use of the fleet-wide controller, ``services.py``), the
supervisor places and launches each epoch (or reattaches to one at console start); the rest is
done by pieces it builds, each handed the shared ``LiveJob`` and only what else it needs (never
the services, never this): ``JobLease``, ``OpenIncident``, ``Probe``, ``Launcher``,
``LinkLoss`` (what a lost link means), ``Orders`` (an operator's requests), ``JobMessages``
(what members say: the one dispatcher, given this job's ``Commits``), ``Observe`` (a
read-only console's view), ``Assignment`` (hosts and spares), ``FirstPlacement`` (where the
first epoch starts), ``Reattach`` (a run found at console start), ``Meeting`` and
``start_epoch`` (each epoch's rendezvous and Starts), ``GroupEpoch`` (one epoch's links,
leases, silence, and the last lease of a clean quit), ``MemberEvents`` (a
member's silence, loss or GPU move, and the incident it opens), ``GroupRecovery`` (what to do
once an epoch ended), ``ResumeStep`` (the step to resume from, replicas promoted),
``WarmExecutors`` (survivors kept warm, replacements readied) and ``Commits`` (two-phase
commit). Orders (stop, checkpoint now) go to rank 0's executor over its link now (a relink
followed; else the first member still linked), and the executors agree at each step boundary,
so every member stops or checkpoints at the same step.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections import deque
from typing import TYPE_CHECKING

from console.fleet.link import ExecutorLink, LinkError
from console.reach.transport.base import Transport
from console.records.state_store import JobRecord
from console.replication.replicator import rank_shard
from console.spares.spare_keeper import SpareKeeper
from console.spares.targets import Targets
from console.states import FailureKind, HostState, JobState
from console.supervise.assign import Assignment
from console.supervise.first_placement import FirstPlacement
from console.supervise.group.commit import Commits
from console.supervise.group.elastic import Growth
from console.supervise.group.epoch import GroupEpoch
from console.supervise.group.meeting import Meeting
from console.supervise.group.member_events import MemberEvents
from console.supervise.group.recovery import GroupRecovery
from console.supervise.group.resume import ResumeStep
from console.supervise.group.start import start_epoch
from console.supervise.group.warm import WarmExecutors
from console.supervise.incident import OpenIncident
from console.supervise.launcher import Launcher
from console.supervise.lease import JobLease
from console.supervise.leave import LastLease
from console.supervise.link_loss import LinkLoss
from console.supervise.live import LiveField, LiveJob, Transitions
from console.supervise.member import Member
from console.supervise.messages import JobMessages
from console.supervise.observe import Observe
from console.supervise.orders import Orders
from console.supervise.outcome import Exit, Outcome
from console.supervise.probe import Probe
from console.supervise.read_back import LINK_CLOSED, NO_CONSOLE, ReadBack
from console.supervise.reattach import Reattach, recorded_members
from console.supervise.restart import RestartBudget
from console.supervise.standby import Prepared, Standby
from console.supervise.twin import Twin
from protocol.faults import StopReason
from protocol.messages import ExecutorState, Progress, Stop
from protocol.spec import CheckpointManifest

if TYPE_CHECKING:
    from console.supervise.services import JobServices

__all__ = ["Prepared", "Supervisor"]

UNSAVED_RETRY_S = 0.5
"""How often a Start held back by a state that cannot be saved is tried again."""


class Supervisor:
    """A job's supervisor, one host or a group: one executor per member (a job on one host has
    one member); the console the coordinator."""

    rec: LiveField[JobRecord] = LiveField()
    failure: LiveField[FailureKind | None] = LiveField()
    why: LiveField[str] = LiveField()
    host: LiveField[str | None] = LiveField()
    spares: LiveField[list[str]] = LiveField()
    link: LiveField[ExecutorLink | None] = LiveField()
    last_seen: LiveField[float] = LiveField()
    step: LiveField[int] = LiveField()
    loss: LiveField[float] = LiveField()
    steps_per_s: LiveField[float] = LiveField()
    checkpoint: LiveField[CheckpointManifest | None] = LiveField()
    history: LiveField[deque[tuple[float, int, float, float]]] = LiveField()
    checkpoints: LiveField[deque[tuple[str, CheckpointManifest]]] = LiveField()
    log_tail: LiveField[deque[str]] = LiveField()
    incident: LiveField[int | None] = LiveField()
    resumed_step: LiveField[int | None] = LiveField()
    sha256: LiveField[str | None] = LiveField()
    approval: LiveField[asyncio.Future[bool] | None] = LiveField()
    stop_requested: LiveField[bool] = LiveField()

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
        self._wait_for_hosts = services.wait_for_hosts
        self._assignment = Assignment(
            self.live,
            inv=inv,
            fleet=fleet,
            reserved=self._reserved,
            priorities=services.priorities,
            take_spare=services.take_spare,
            need_host=services.need_host,
            save=store.save,
            journal=journal,
            alert=services.alert,
        )
        """Where the job trains now, and its spares: one rule for one host and a group."""
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
        self.commits = Commits(rec, store.save, len(self._placed(rec)))
        """A step is the job's once every member's shard of it is written (two-phase)."""
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
            commits=None if services.read_only else self.commits,
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
        self._policy = services.policy
        self._detection = services.detection
        self._placement = inv.jobs[name].placement
        self.epoch_run: GroupEpoch | None = None
        self.meeting = Meeting(name, executor=self.spec.executor, inv=inv)
        """Where and how the members meet each epoch."""

        def members() -> list[str]:
            return self.members  # read when used: a failover places the job anew

        self._resume = ResumeStep(
            name,
            commits=self.commits,
            inv=inv,
            fleet=self._fleet,
            launcher=self.launcher,
            alert=services.alert,
            incident=self._incident,
            members=members,
            replicator=services.replicator,
            ensure=lambda target: self._targets.ensure_replica(target, self._messages.newest(0)),
        )
        self._events = MemberEvents(self.live, states=self._states, incident=self._incident)
        self._standby = Standby(
            self.live,
            fleet=self._fleet,
            journal=self._journal,
            launcher=self.launcher,
            probe=self._probe,
        )
        """The warm standby on the first spare (``warm_standby``)."""
        self._twin = Twin(
            self.live,
            launcher=self.launcher,
            journal=self._journal,
            pump=self._standby.pump,
            pumping=self._standby.pumping,
        )
        """The warm twin beside a group of one's executor (``warm_twin``, one host's only)."""
        self._executors = WarmExecutors(
            self.live,
            launcher=self.launcher,
            lease=self.lease,
            fleet=self._fleet,
            journal=self._journal,
            policy=self._policy,
            members=members,
            wait_gone=self._probe.wait_gone,
            standby=self._standby,
            twin=self._twin,
        )
        self.growth = Growth(
            self.live,
            inv=inv,
            fleet=self._fleet,
            journal=self._journal,
            policy=self._policy,
            members=members,
            reserved=self._reserved,
            move=lambda reason, why: self.request_move(reason, why),
            save=services.store.save,
        )
        self._keeper = SpareKeeper(
            self.live,
            inv=inv,
            fleet=self._fleet,
            journal=self._journal,
            hosts=lambda: list(self.members),
            send_newest=self._messages.send_newest,
            reserved=self._reserved,
            priorities=self._priorities,
            save=services.store.save,
            after=self._standby.follow_spares,
        )
        self._group_recovery = GroupRecovery(
            self.live,
            states=self._states,
            incident=self._incident,
            open_incident=self._events.open_incident,
            inv=inv,
            fleet=self._fleet,
            journal=self._journal,
            alert=services.alert,
            save=services.store.save,
            policy=self._policy,
            restarts=self._restarts,
            pick=self._targets.pick,
            wait_for_hosts=self._wait_for_hosts,
            stop_before_start=self._stop_before_start,
            executors=self._executors,
            resume=self._resume,
            members=members,
            assign=self._assign_members,
            growth=self.growth,
            reap=self._probe.reap,
            wind_down=self._wind_down,
        )
        self._first = FirstPlacement(
            name,
            members=members,
            inv=inv,
            fleet=self._fleet,
            reserved=self._reserved,
            priorities=self._priorities,
            targets=self._group_recovery.targets,
            assign=self._assign_members,
            stop_before_start=self._stop_before_start,
            wait_note=self._states.wait_note,
            wait_for_hosts=self._wait_for_hosts,
            journal=self._journal,
        )
        """Where the first epoch under this console starts."""
        self._reattach = Reattach(
            self.live,
            lease=self.lease,
            commits=self.commits,
            one_host=self._one_host(),
            link=self.launcher.link,
            assign=self._assign_members,
            epoch=self._epoch,
            retire=self._retire,
            warm=self._executors.warm,
            steer=self._steer,
            states=self._states,
            incident=self._incident,
            journal=self._journal,
            after=self._reattached,
        )
        """A run found at console start, taken as it is."""

    # ---------------------------------------------------------------- state

    @property
    def state(self) -> JobState:
        return self.live.state

    @property
    def epoch(self) -> int:
        return self.live.epoch

    @property
    def members(self) -> list[str]:
        """The job's hosts now, by node rank: its record's (``_assign_members`` writes it), so
        a view attached to the owning console, which reads the record again, sees a move."""
        return self._placed(self.live.rec)

    def hosts_in_use(self) -> list[str]:
        return list(self.members)

    def shards(self) -> list[int | None]:
        sharded = not self._one_host()  # a group of one replicates whole, as one host did
        return [rank_shard(sharded, r) for r in range(len(self.members))]

    @property
    def standby(self) -> Prepared | None:
        return self._standby.warm

    def _one_host(self) -> bool:
        return not self._inv.multi_host(self.name)

    def _placed(self, rec: JobRecord) -> list[str]:
        """The members the record names, else the inventory's (read as the commits are built,
        early in the constructor)."""
        return recorded_members(rec, self._one_host()) or self._inv.members(self.name)

    def _move_rank(self, m: Member, reason: StopReason, why: str) -> None:
        """Only ``m``'s rank leaves its host: the next epoch puts it on another."""
        self._events.move(m, reason, why)

    def _refused(self, host: str, step: int) -> None:
        self._resume.refuse(host, step)

    def _preparing(self) -> bool:
        """An executor is readied on a replacement while a lost member's lease runs out: its
        coming up is a phase of the incident the lease's end opens (kept until then)."""
        return bool(self._executors.readied)

    def _rank0(self) -> Member:
        """The executor the job's link reaches, as node rank 0 (a single host's, a group's
        first member's: what a read-only console watches)."""
        job = self.live
        return Member(0, job.host or "", link=job.link, last_seen=job.last_seen)

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

    def _last_host(self) -> str | None:
        return self.members[0] if self.members else None

    def _release(self) -> None:
        self._group_recovery.release()

    async def _supervise(self) -> None:
        job = self.live
        run = await self._reattach.attach(again=self.starting_again)
        resume = self.commits.committed
        placed = run is not None  # reattached: its members train where they are
        try:
            while not job.state.is_terminal():
                if run is None:
                    if self._stop_before_start():
                        return
                    if not placed:
                        moved = await self._first.place()
                        if moved is None:
                            return
                        if moved:  # a rank new to its host loads what it holds of the job
                            resume = await self._resume.step(moved)
                    placed = True
                    run = await self._launch_epoch(resume)
                beside = [
                    asyncio.create_task(self.growth.watch(), name=f"grow {self.name}"),
                    asyncio.create_task(self._keeper.keep(), name=f"spares {self.name}"),
                ]
                try:
                    await run.watch()
                finally:
                    for task in beside:
                        task.cancel()
                    await asyncio.gather(*beside, return_exceptions=True)
                self.epoch_run = None
                self._reattach.pending = False
                # survivors under lease first: whatever comes next may wait (a dead host's
                # events read back, a replacement's start); a job over stops keeping them
                await self._executors.keep_survivors_warm(run.members)
                await self._read_back_shards(run)
                nxt = await self._group_recovery.recover(run)
                if nxt is None:
                    return
                (resume,) = nxt
                run = None
        finally:
            if job.state.is_terminal():  # a job over keeps nothing readied
                await self._wind_down()
            else:  # a console quitting leaves the standby and twin to their idle exit
                await self._executors.stop_keeping()
                await self._executors.drop_readied([])
                await self._standby.cancel_warm()
                await self._twin.cancel_keep()
            self._incident.forget_early()  # a readying no incident opened for

    async def _wind_down(self) -> None:
        """Nothing readied for a job that is over stays: readied replacements, the warm
        standby, the warm twin."""
        await self._executors.stop_keeping()
        await self._executors.drop_readied([])
        await self._standby.drop_warm()
        await self._twin.drop()

    async def _read_back_shards(self, run: GroupEpoch) -> None:
        """Each member's checkpoint at its end that its link never delivered, read from its
        events (``ReadBack``, as for a single host): once every member's shard of the step is
        read, the step is committed and the group resumes there. A group preempted while no
        console watched resumed from the step before, 12 steps back."""
        await asyncio.gather(
            *(
                # a member this console never heard (found gone at its start): no console was
                # there to hear its last checkpoint
                self._read_back.read_back(m, m.exit, LINK_CLOSED if m.last_seen else NO_CONSOLE)
                for m in run.members
                if m.exit is not None
            )
        )

    # --------------------------------------------------------------- launch

    def _assign_members(self, plan: list[str]) -> None:
        self._assignment.members(plan)

    async def _launch_epoch(self, resume: int | None) -> GroupEpoch:
        job = self.live
        plan = list(self.members)
        self._states.move(JobState.DEPLOYING, f"on {', '.join(plan)}")
        if self._twin.host not in (None, *plan):
            await self._twin.drop()  # the job left its host: no twin lingers there
        self._assign_members(plan)
        await self._executors.drop_readied(plan)
        got = await self._executors.take(plan)
        # no epoch starts that the disk cannot hold (a full disk: the job waits, idle)
        await self._until_saved(f"{self.name} waits to start: its state cannot be persisted")
        # the first started waited for the slowest: each first lease from a current reading
        got = await asyncio.gather(
            *(self._executors.fresh(h, g) for h, g in zip(plan, got, strict=True))
        )
        job.rec.epoch += 1
        self._save()
        epoch = job.rec.epoch
        self._messages.new_epoch(plan)
        self.commits.new_epoch(epoch, len(plan))
        now = time.monotonic()
        members = [Member(r, h, last_seen=now) for r, h in enumerate(plan)]
        run = self._epoch(members, epoch, resume)
        failed = [(m, g) for m, g in zip(members, got, strict=True) if isinstance(g, Outcome)]
        if failed:
            for g in got:
                if isinstance(g, ExecutorLink):
                    g.close()  # idle, never started: the next launch takes it again
            for m, g in failed:
                assert isinstance(g, Outcome)
                run.ended(m, g)
            for m in members:
                run.ended(m, Outcome(Exit.CRASHED, "the group did not start"))
            return run
        if job.stop_requested:  # asked while the members were readied: none is Started
            for m, g in zip(members, got, strict=True):
                if isinstance(g, ExecutorLink):
                    await self._retire(g, m.host, why=StopReason.OPERATOR)
                    g.close()
                run.ended(m, Outcome(Exit.STOPPED, "stopped by an operator before its start"))
            return run
        await start_epoch(
            run,
            [g for g in got if isinstance(g, ExecutorLink)],
            rendezvous=self.meeting.rendezvous(plan, resume),
            spec=self.spec,
            ttl_s=self.lease.ttl_s,
            reading=self._reading,
            journal=self._journal,
            planned=self.growth.planned,
        )
        self._steer()  # rank 0's link, else the first linked member's
        job.last_seen = now
        self._states.move(JobState.RUNNING, f"on {', '.join(plan)}, epoch {epoch}")
        if self._placement.standby:
            self._standby.keep_warm()
        self._keep_twin()
        return run

    def _keep_twin(self) -> None:
        if self._placement.warm_twin:  # a job on one host's only
            self._twin.keep()

    async def _reading(self, host: str, link: ExecutorLink) -> ExecutorLink:
        """``link``, or a new one to the same idle executor when its Hello is old: a current
        clock reading for its first lease (a member's link is not read before its Start)."""
        got = await self._executors.fresh(host, link)
        if isinstance(got, Outcome):
            raise LinkError(got.why)
        return got

    def _epoch(self, members: list[Member], epoch: int, resume: int | None = None) -> GroupEpoch:
        run = GroupEpoch(
            members,
            epoch=epoch,
            resume=resume,
            lease=self.lease,
            detection=self._detection,
            loss=self._loss,
            on_message=self._messages.on_message,
            collective_timeout_s=self.meeting.collective_timeout_s,
            silent=self._silent,
            lost=self._events.lost,
            unreachable=self._executors.ready_replacement,
            answered=self._answered,
            leave=self._last_lease.leave,
        )
        self.epoch_run = run
        return run

    def _steer(self) -> None:
        """The link an operator's orders go over (``live.link``): rank 0's, else the first
        member's still linked (a Stop or Drain to one member stops every member at one step).
        Kept in step with relinks, as a single host's is: it stayed rank 0's first link, so
        after a blip on it a stop went nowhere and the group trained on to its end."""
        run = self.epoch_run
        if run is not None:
            linked = [m.link for m in run.members if m.link is not None and m.exit is None]
            self.live.link = linked[0] if linked else None

    def _silent(self, m: Member) -> None:
        self._events.silent(m)
        self._steer()

    async def _answered(self, m: Member, running: list[Member]) -> None:
        """``m`` answers again after a silence (a blip): orders go over its new link, once no
        member of the epoch is silent the job reads as before, and an executor readied to
        replace it is stopped (it sat idle on the spare until the epoch ended, holding it)."""
        self._steer()
        self._events.answered(m, running)
        if all(x.link is not None for x in running):
            self._executors.call_off(f"{m.host} answers again")  # beside: m's link is read on
            self._incident.forget_early()  # what was readied belongs to no incident
            run = self.epoch_run
            if self._reattach.pending and run is not None and len(running) == len(run.members):
                self._reattach.done(run.members)  # silent at console start: alive, slow to answer

    def _reattached(self) -> None:
        """After a reattach: the warm twin kept, a drain found at console start made."""
        self._keep_twin()
        self._drain_found()

    async def _retire(
        self, link: ExecutorLink, host: str, why: StopReason = StopReason.NOT_NEEDED
    ) -> None:
        """An executor this console will not Start (idle, or of another epoch): stop it, wait
        for its lock."""
        if link.hello is not None:
            self.dismissed.add((host, link.hello.pid))
        with contextlib.suppress(LinkError):
            await link.send(Stop(reason=why, checkpoint=False))
        await link.finish()  # read to its close: a Stop closed on at once could go unheard
        await self._probe.wait_gone(host)

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
