"""Every job's life (issue 30: one supervisor; a job on one host is a group of one, keeping
one host's replica layout and journal wording): start every member at one epoch, watch them,
and when any member's run ends, restart the group at a new epoch, same world size and rank
order, from the newest step every member committed, a lost member's host replaced by a spare.

Example for one host: ``a running -> a unreachable -> its lease waited out -> b (a spare,
its executor readied meanwhile; replica promoted) at epoch 2 from step 40 -> running``.

Example sequence (as in the journal): ``a, b, c running (epoch 1) -> c unreachable -> its
lease waited out -> c replaced by d (shard of step 40 promoted there) -> a, b (in place,
torch warm), d at epoch 2 from step 40 -> running``.

The supervisor places and launches each epoch (or reattaches to one at console start); the
rest is done by pieces it builds, each handed the shared ``LiveJob`` and only what else it
needs: ``GroupEpoch`` (one epoch's links, leases, silence), ``JobMessages`` (what members
say: the dispatcher every job has, given this group's ``Commits``), ``MemberEvents`` (a
member's silence, loss or GPU move, and the incident it opens), ``GroupRecovery`` (what to do once an epoch
ended), ``ResumeStep`` (the step to resume from, replicas promoted), ``WarmExecutors``
(survivors kept warm, replacements readied) and ``Commits`` (two-phase commit). Orders (stop,
checkpoint now) go to rank 0's executor over its link now (a relink followed; else the first
member still linked), and the executors agree at each step boundary, so every member stops
or checkpoints at the same step.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import random
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import msgspec

from console.fleet.hosts import PROBE_RULE
from console.fleet.link import ExecutorLink, LinkError
from console.records.journal import Kind
from console.records.state_store import JobRecord
from console.replication.replicator import rank_shard
from console.spares.placement import choose_primary
from console.spares.spare_keeper import SpareKeeper
from console.states import HostState, JobState
from console.supervise.group.commit import Commits
from console.supervise.group.elastic import Growth
from console.supervise.group.epoch import GroupEpoch
from console.supervise.group.member_events import MemberEvents
from console.supervise.group.recovery import GroupRecovery
from console.supervise.group.resume import ResumeStep
from console.supervise.group.warm import WarmExecutors
from console.supervise.lease import NoAnchor
from console.supervise.member import Member
from console.supervise.outcome import Exit, Outcome
from console.supervise.read_back import LINK_CLOSED, NO_CONSOLE
from console.supervise.standby import Prepared, Standby
from console.supervise.start_lease import granted_start
from console.supervise.supervisor import Supervisor
from console.supervise.twin import Twin
from protocol.faults import StopReason
from protocol.messages import Backend, ExecutorState, Rendezvous, Start

if TYPE_CHECKING:
    from console.supervise.services import JobServices

PORTS = (20000, 30000)
"""The master port of each epoch is drawn from this range (a new one each epoch: a port left
in TIME_WAIT, or taken, costs one failed epoch, not the job)."""


def next_port(last: int | None, draw: Callable[[int, int], int] = random.randrange) -> int:
    """A master port from ``PORTS`` unlike the previous epoch's, whose sockets may linger."""
    port = draw(PORTS[0], PORTS[1] - 1)
    return port + 1 if last is not None and port >= last else port


def recorded_members(rec: JobRecord, one_host: bool) -> list[str]:
    """The member hosts the job's record names, by node rank: its members; for a job on one
    host (``one_host``), a record with its host and no members (written for a single host's
    executor) names a group of one, whose executor is reattached, not started anew."""
    if rec.members:
        return list(rec.members)
    return [rec.host] if one_host and rec.host else []


class GroupSupervisor(Supervisor):
    """A job with ``hosts = [...]``: one executor per member host, the console the coordinator."""

    def __init__(self, services: JobServices, name: str) -> None:
        super().__init__(services, name)
        inv = services.inv
        self._policy = services.policy
        self._detection = services.detection
        self.placement = inv.jobs[name].placement
        self.epoch_run: GroupEpoch | None = None
        self._reattaching = False
        """Reattached at console start to an epoch some member of which did not answer then:
        once every one answers (alive, slow), the job reads reattached."""
        self.collective_timeout_s = max(10.0, inv.console.lease_s)
        self._last_port: int | None = None

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

    def _checkpoint_commits(self, rec: JobRecord, save: Callable[[], object]) -> Commits | None:
        """A step is the job's once every member's shard of it is written (two-phase)."""
        self.commits = Commits(rec, save, len(self._placed(rec)))
        return self.commits

    def _one_host(self) -> bool:
        return not self._inv.multi_host(self.name)

    def _placed(self, rec: JobRecord) -> list[str]:
        """The members the record names, else the inventory's (read before ``members`` is
        set: the commits are built in the base constructor)."""
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

    # ------------------------------------------------------------------ run

    def _last_host(self) -> str | None:
        return self.members[0] if self.members else None

    def _release(self) -> None:
        self._group_recovery.release()

    async def _supervise(self) -> None:
        job = self.live
        run = await self._reattach()
        resume = self.commits.committed
        placed = run is not None  # reattached: its members train where they are
        try:
            while not job.state.is_terminal():
                if run is None:
                    if self._stop_before_start():
                        return
                    if not placed:
                        moved = await self._first_placement()
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
                self._reattaching = False
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

    async def _first_placement(self) -> list[int] | None:
        """Before this console's first epoch of the job: a member host that may take no job
        (cordoned, draining or drained by an operator, being released, failing a health rule)
        gives its rank to another, chosen as a failover's replacement is
        (``GroupRecovery.targets``: readied hosts, the spares, the nearest usable host) and
        waited for while there is none, as a single host's job is placed only on a usable
        host. The group started on a cordoned or drained member host. A host down or not
        yet heard is not judged here: its deploy fails and the recovery replaces it (under a
        policy that asks, once approved). The node ranks given to another host (each resumes
        from what that host holds of the job: its replica); None: the job was stopped while it
        waited.

        A job declared by its region alone (no ``host``) starts on the best usable host for
        it (``choose_primary``: its region's first, a lower-priority job's spare if need be)."""
        if not self.members:
            host = await self._primary()
            if host is None:
                return None
            self._assign_members([host])
            return []
        plan = list(self.members)
        why = {h: self._may_not_start_on(h) for h in plan}
        out = [h for h in plan if why[h] is not None]
        if not out:
            return []
        ranks = ", ".join(f"{h} ({why[h]})" for h in out)
        targets = await self._group_recovery.targets(
            out,
            survivors=len(plan) - len(out),
            waits=f"no usable host for {self.name} in place of {ranks}: it waits for a host",
        )
        if targets is None:
            return None
        for old, new in zip(out, targets, strict=True):
            self._journal.record(
                Kind.PLACEMENT,
                f"{self.name}: {old} {why[old]}: its rank starts "
                + (f"on {new}" if new else "nowhere (the group shrinks)"),
                job=self.name,
                host=old,
                data={"from": old, "to": new, "change": "member"},
            )
        moved = dict(zip(out, targets, strict=True))  # the hosts left are freed (_assign)
        self._assign_members([h for h in (moved.get(h, h) for h in plan) if h is not None])
        return [r for r, h in enumerate(self.members) if h not in plan]

    async def _primary(self) -> str | None:
        """The host a job declared by region starts on, waited for while there is none; None:
        it was stopped meanwhile."""
        while True:
            host = choose_primary(
                self._inv,
                self.name,
                usable=self._fleet.usable(),
                reserved=self._reserved(),
                priority=self._priorities(),
            )
            if host is not None:
                return host
            if self._stop_before_start():  # an operator's stop while it waited: honoured
                return None
            self._states.wait_note(f"no usable host for {self.name}: it waits for a host")
            await self._wait_for_hosts()

    def _may_not_start_on(self, host: str) -> str | None:
        rt = self._fleet.hosts[host]
        if rt.state in (HostState.CORDONED, HostState.DRAINING, HostState.DRAINED):
            return f"is {rt.state.value}"
        if rt.leaving:
            return "is being released"
        # a host the probe cannot reach is judged by its deploy (a fault, not an unfit host):
        # the probe's finding may come before the host reads down
        failing = [f for f in self._fleet.failing(host) if f.rule != PROBE_RULE]
        return f"fails a health rule ({failing[0].message})" if failing else None

    # --------------------------------------------------------------- launch

    def _assign_members(self, plan: list[str]) -> None:
        self.live.rec.members = list(plan)
        self._assign(plan)

    async def _launch_epoch(self, resume: int | None) -> GroupEpoch:
        job = self.live
        plan = list(self.members)
        self._states.move(JobState.DEPLOYING, f"on {', '.join(plan)}")
        if self._twin.host not in (None, *plan):
            await self._twin.drop()  # the job left its host: no twin lingers there
        self._assign_members(plan)
        await self._executors.stop_keeping()
        await self._executors.drop_readied(plan)
        got = await asyncio.gather(*(self._executors.executor(h) for h in plan))
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
        run = self._epoch(members, epoch)
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
        rdv = Rendezvous(
            node_rank=0,
            addresses=[self._inv.data_address(h) for h in plan],
            master_port=(port := next_port(self._last_port)),
            procs_per_host=self.procs_per_host(plan),
            backend=Backend(self.placement.backend or self._default_backend(plan)),
            resume_step=resume,
            timeout_s=self.collective_timeout_s,
            logical_ranks=self._inv.logical_ranks(self.name),
            deterministic_reduce=self.placement.deterministic_reduce,
        )
        self._last_port = port
        self._journal.record(
            Kind.EXECUTOR,
            f"{self.name}: epoch {epoch} on {', '.join(plan)}, master "
            f"{rdv.master_addr}:{rdv.master_port}, "
            + (f"resuming from committed step {resume}" if resume else "from step 0"),
            job=self.name,
            host=plan[0],
            data={
                "epoch": epoch,
                "members": plan,
                "port": rdv.master_port,
                "resume": resume,
                "planned": self.growth.planned,
            },
        )
        for m, link in zip(members, got, strict=True):
            assert isinstance(link, ExecutorLink)
            m.link = link
            ours = msgspec.structs.replace(rdv, node_rank=m.node_rank)

            def grant(link: ExecutorLink, m: Member = m, ours: Rendezvous = ours) -> Start:
                m.link = link
                return run.start(m, self.spec, ours)

            try:  # granted on a current reading, and again if the grant spent half of it
                link, start = await granted_start(
                    link,
                    m.host,
                    job=self.name,
                    ttl_s=self.lease.ttl_s,
                    reading=functools.partial(self._reading, m.host),
                    grant=grant,
                    journal=self._journal,
                )
                await link.send(start)
            except LinkError as e:
                run.ended(m, Outcome(Exit.CRASHED, f"executor on {m.host} went away: {e}"))
            except NoAnchor as e:  # its bound could not be persisted (the disk filled again)
                run.ended(m, Outcome(Exit.CRASHED, f"not started on {m.host}: {e}"))
        self._steer()  # rank 0's link, else the first linked member's
        job.last_seen = now
        self._states.move(JobState.RUNNING, f"on {', '.join(plan)}, epoch {epoch}")
        if self._inv.jobs[self.name].placement.standby:
            self._standby.keep_warm()
        self._keep_twin()
        return run

    def _keep_twin(self) -> None:
        if self._inv.jobs[self.name].placement.warm_twin:  # a job on one host's only
            self._twin.keep()

    async def _reading(self, host: str, link: ExecutorLink) -> ExecutorLink:
        """``link``, or a new one to the same idle executor when its Hello is old: a current
        clock reading for its first lease (a member's link is not read before its Start)."""
        got = await self._executors.fresh(host, link)
        if isinstance(got, Outcome):
            raise LinkError(got.why)
        return got

    def procs_per_host(self, plan: list[str]) -> int:
        """Ranks on each host of ``plan``: the job's own, else one for the torch kind, else the
        fewest GPUs of a member (at least one)."""
        if self.placement.procs_per_host is not None:
            return self.placement.procs_per_host
        if self.spec.executor == "torch":
            return 1  # the torch kind: one rank per host unless asked (bit-exact with before)
        return max(1, min(self._inv.hosts[h].gpus for h in plan))

    def _default_backend(self, plan: list[str]) -> Backend:
        return Backend.NCCL if all(self._inv.hosts[h].gpus > 0 for h in plan) else Backend.GLOO

    def _epoch(self, members: list[Member], epoch: int) -> GroupEpoch:
        run = GroupEpoch(
            members,
            epoch=epoch,
            lease=self.lease,
            detection=self._detection,
            loss=self._loss,
            on_message=self._messages.on_message,
            collective_timeout_s=self.collective_timeout_s,
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
            if self._reattaching and run is not None and len(running) == len(run.members):
                self._reattached(run.members)  # silent at console start: alive, slow to answer

    # ------------------------------------------------------------- reattach

    async def _reattach(self) -> GroupEpoch | None:
        """A console started while the group had an epoch: take the members that still train
        it; a member that cannot be reached is waited out under the persisted lease bound
        (it may still be training), never taken for gone."""
        job = self.live
        plan = recorded_members(job.rec, self._one_host())
        if not plan or job.epoch == 0 or self.starting_again:
            # started again by an operator: its last epoch ended as this console saw (stopped,
            # failed), and what its members' events say of it is no news (a stop read back
            # from them failed the job again as stopped)
            return None
        self.lease.restore()
        self._assign_members(plan)
        members = [Member(r, h, until=self.lease.until) for r, h in enumerate(plan)]
        run = self._epoch(members, job.epoch)
        self.commits.new_epoch(job.epoch, len(plan))
        for m in members:
            link = self.launcher.link(m.host)
            try:
                hello = await link.open(timeout=2)
            except LinkError:
                continue  # unreachable: its lease is waited out by the epoch's watch
            if hello.epoch == job.epoch and hello.state in (
                ExecutorState.TRAINING,
                ExecutorState.STOPPING,
            ):
                m.link, m.last_seen, m.step = link, time.monotonic(), hello.step
                with contextlib.suppress(LinkError):
                    await link.send(run.grant(m))
            elif hello.epoch == job.epoch and hello.state == ExecutorState.FAULTED:
                self._executors.warm.add(m.host)
                link.close()
                run.ended(m, Outcome(Exit.RUN_CRASHED, f"the run on {m.host} had ended"))
            else:
                await self._retire(link, m.host)
                link.close()
                run.ended(m, Outcome(Exit.CRASHED, f"no executor of epoch {job.epoch} on {m.host}"))
        linked = [m for m in members if m.link is not None]
        self._steer()  # rank 0's link, else the first linked member's
        if len(linked) == len(members):
            self._reattached(members)
        else:
            self._reattaching = True
            self._states.move(
                JobState.PENDING,
                f"{len(members) - len(linked)} member(s) not at epoch {job.epoch} at console "
                f"start: waiting out their lease ({max(0.0, self.lease.left()):.0f} s left at "
                "most); the group restarts once it ends",
            )
        return run

    def _reattached(self, members: list[Member]) -> None:
        """Every member of the epoch this console found trains it, linked: at console start,
        or once one silent then (alive, slow to answer) answers."""
        job = self.live
        self._reattaching = False
        job.step = max(m.step for m in members)
        if job.incident is not None:  # a console restart: the group never stopped
            job.resumed_step = job.step
            self._incident.phase("loaded", step=job.step, last_step=job.step)
        pids = [
            f"executor pid {m.link.hello.pid if m.link and m.link.hello else '?'} on {m.host}"
            for m in members
        ]
        self._journal.record(
            Kind.EXECUTOR,
            f"{self.name}: reattached to "
            + (
                f"all {len(members)} members at epoch {job.epoch} ({', '.join(pids)})"
                if len(members) > 1
                else pids[0]  # a group of one: as one host's ("executor pid N on a")
            ),
            job=self.name,
            host=members[0].host,
            data={"epoch": job.epoch, "members": [m.host for m in members]},
        )
        self._states.move(JobState.RUNNING, "reattached")
        self._keep_twin()
        self._drain_found()
