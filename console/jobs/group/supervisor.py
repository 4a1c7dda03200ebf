"""A multi-host job's life: start every member at one epoch, watch them, and when any member's
run ends, restart the group at a new epoch, same world size and rank order, from the newest
step every member committed, a lost member's host replaced by a spare.

Example sequence (as in the journal): ``a, b, c running (epoch 1) -> c unreachable -> its
lease waited out -> c replaced by d (shard of step 40 promoted there) -> a, b (in place,
torch warm), d at epoch 2 from step 40 -> running``.

The pieces of one epoch (links, leases, silence) are ``GroupEpoch``; two-phase commit is
``Commits``. Orders (stop, checkpoint now) go to rank 0's executor, and the executors agree at
each step boundary, so every member stops or checkpoints at the same step.
"""

from __future__ import annotations

import asyncio
import contextlib
import posixpath
import random
import time
from typing import TYPE_CHECKING

import msgspec

from console import clock
from console.fleet.link import ExecutorLink, LinkError
from console.jobs.group.commit import Commits
from console.jobs.group.epoch import GroupEpoch, Member
from console.jobs.outcome import Exit, Outcome
from console.jobs.placement import choose_spares, rank
from console.jobs.policy import Decision, decide
from console.jobs.replicator import Source, shard_key
from console.jobs.supervisor import JobSupervisor
from console.reach.deploy import checkpoint_file, replica_dir
from console.reach.remote import list_manifests, promote
from console.reach.transport.base import TransportError
from console.records.journal import Kind
from console.states import FailureKind, HostState, JobState
from protocol.messages import (
    CheckpointSaved,
    Drain,
    ExecutorMessage,
    Fault,
    Health,
    Heartbeat,
    Log,
    Progress,
    Rendezvous,
    Resumed,
    RunEnded,
    Stop,
)

if TYPE_CHECKING:
    from console.jobs.controller import Controller

PORTS = (20000, 30000)
"""The master port of each epoch is drawn from this range (a new one each epoch: a port left
in TIME_WAIT, or taken, costs one failed epoch, not the job)."""
KEEP_WARM_S = 1.0


def _clock() -> str:
    return time.strftime("%H:%M:%S")


class GroupSupervisor(JobSupervisor):
    """A job with ``hosts = [...]``: one executor per member host, the console the coordinator."""

    def __init__(self, ctl: Controller, name: str) -> None:
        super().__init__(ctl, name)
        inv = ctl.inv
        self._policy = lambda: ctl.policy
        self._restart_limit = inv.console.restart_limit
        self._detection = ctl.detection
        self._replicator = ctl.replicator
        self._progress = lambda msg: ctl.on_progress(self, msg)
        self._incidents_log = ctl.incidents
        self.placement = inv.jobs[name].placement
        rec = self.live.rec
        self.members: list[str] = list(rec.members) or inv.members(name)
        """The job's hosts now, by node rank."""
        self.commits = Commits(rec, ctl.store.save, len(self.members))
        self.epoch_run: GroupEpoch | None = None
        self._warm: set[str] = set()
        """Hosts whose executor's run ended and that waits, alive, for the next epoch's Start:
        kept under lease while the group recovers."""
        self._keeping: asyncio.Task[None] | None = None
        self._readied: dict[str, asyncio.Task[ExecutorLink | Outcome]] = {}
        """Idle executors started on replacement hosts while a lost member's lease runs out
        (torch imported, waiting for Start): host -> its start."""
        self.collective_timeout_s = max(10.0, inv.console.lease_s)

    def hosts_in_use(self) -> list[str]:
        return list(self.members)

    # ------------------------------------------------------------------ run

    async def run(self) -> None:
        job = self.live
        if self._read_only:
            await self._observe.observe()
            return
        if job.rec.finished_sha256:
            job.step = job.rec.finished_step or self.spec.steps
            job.host = self.members[0]
            self._states.move(JobState.FINISHED, "finished before this console started")
            return
        if job.rec.stopped:
            job.failure = FailureKind.STOPPED
            self._states.move(JobState.FAILED, "stopped by an operator before this console started")
            return
        run = await self._reattach()
        resume = self.commits.committed
        try:
            while not job.state.is_terminal():
                if run is None:
                    if self._stop_before_start():
                        return
                    run = await self._launch(resume)
                await run.watch()
                self.epoch_run = None
                nxt = await self._recover(run)
                if nxt is None:
                    return
                (resume,) = nxt
                run = None
        finally:
            await self._stop_keeping()
            await self._drop_readied([])

    # --------------------------------------------------------------- launch

    def _assign(self, plan: list[str]) -> None:
        job, fleet = self.live, self._fleet
        for h, rt in fleet.hosts.items():
            if rt.job == self.name and h not in plan:
                rt.job = None
        for h in plan:
            fleet.hosts[h].job = self.name
        self.members = list(plan)
        job.host = plan[0]
        job.spares = [s for s in job.spares if s not in plan]
        if not job.spares:
            choice = choose_spares(
                self._inv,
                self.name,
                plan[0],
                usable=fleet.usable(),
                reserved=self._reserved(),
                priority=self._priorities(),
                count=max(1, len(self.placement.spares)),
            )
            for spare, other in choice.taken:
                self._take_spare(spare, other, by=self.name)
            job.spares = choice.spares
        job.rec.host, job.rec.members, job.rec.spares = plan[0], list(plan), list(job.spares)
        self._save()
        self._journal.record(
            Kind.PLACEMENT,
            f"{self.name}: on {', '.join(plan)} (node ranks 0..{len(plan) - 1}), "
            f"spares {', '.join(job.spares) or 'none'}",
            job=self.name,
            host=plan[0],
            data={"members": plan, "spares": job.spares},
        )
        if not job.spares:
            self._alert(
                f"job {self.name} has no spare: a host failure will wait for one", job=self.name
            )

    def _ready_replacement(self, m: Member) -> None:
        """``m``'s host cannot be asked: start an idle executor on the host that would replace
        it, so a replacement decided when the lease ends needs no process start then."""
        if self._readied or decide(self._policy(), failover=True) is not Decision.ACT:
            return
        usable = self._fleet.usable(exclude=set(self.members))
        spares = [s for s in self.live.spares if s in usable]
        target = next(iter(spares), None)
        if target is None:
            return
        self._journal.record(
            Kind.EXECUTOR,
            f"{self.name}: {m.host} cannot be reached; readying an executor on {target} "
            "while its lease runs out",
            job=self.name,
            host=target,
        )
        self._readied[target] = asyncio.create_task(
            self.launcher.start(target, promote_upto=None, released=lambda _h: None)
        )

    async def _drop_readied(self, keep: list[str]) -> None:
        """Readied executors on hosts the next epoch does not use are stopped."""
        for host in [h for h in self._readied if h not in keep]:
            task = self._readied.pop(host)
            if not task.done():
                task.cancel()  # the launcher stops an executor whose start was cancelled
                await asyncio.gather(task, return_exceptions=True)
                continue
            got = task.result() if not task.cancelled() else None
            if isinstance(got, ExecutorLink):
                await self._send_quietly(got, Stop(reason="not needed", checkpoint=False))
                got.close()

    async def _executor(self, host: str) -> ExecutorLink | Outcome:
        """The executor that will run this member: a warm one (its run ended, it waits), one
        readied while a lost member's lease ran out, else one started (deployed first)."""
        readied = self._readied.pop(host, None)
        if readied is not None:
            try:
                got = await readied
            except asyncio.CancelledError:
                got = None
            if isinstance(got, ExecutorLink):
                # a fresh link: its Hello is a current clock reading to anchor the first lease
                # to (the readied link's is as old as the lease wait)
                got.close()
                link = self.launcher.link(host)
                with contextlib.suppress(LinkError):
                    if (await link.open(timeout=5)).state == "idle":
                        return link
                link.close()
        if host in self._warm:
            self._warm.discard(host)
            link = self.launcher.link(host)
            with contextlib.suppress(LinkError):
                hello = await link.open(timeout=5)
                if hello.state == "faulted":
                    return link
            link.close()
        return await self.launcher.start(host, promote_upto=None, released=lambda _h: None)

    async def _launch(self, resume: int | None) -> GroupEpoch:
        job = self.live
        plan = list(self.members)
        self._states.move(JobState.DEPLOYING, f"on {', '.join(plan)}")
        self._assign(plan)
        await self._stop_keeping()
        await self._drop_readied(plan)
        got = await asyncio.gather(*(self._executor(h) for h in plan))
        job.rec.epoch += 1
        self._save()
        epoch = job.rec.epoch
        self.commits.new_epoch(epoch)
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
        rdv = Rendezvous(
            node_rank=0,
            addresses=[self._inv.data_address(h) for h in plan],
            master_port=random.randrange(*PORTS),
            procs_per_host=self._procs_per_host(plan),
            backend=self.placement.backend or self._default_backend(plan),
            resume_step=resume,
            timeout_s=self.collective_timeout_s,
        )
        self._journal.record(
            Kind.EXECUTOR,
            f"{self.name}: epoch {epoch} on {', '.join(plan)}, master "
            f"{rdv.master_addr}:{rdv.master_port}, "
            + (f"resuming from committed step {resume}" if resume else "from step 0"),
            job=self.name,
            host=plan[0],
            data={"epoch": epoch, "members": plan, "port": rdv.master_port, "resume": resume},
        )
        for m, link in zip(members, got, strict=True):
            assert isinstance(link, ExecutorLink)
            m.link = link
            try:
                start = run.start(m, self.spec, msgspec.structs.replace(rdv, node_rank=m.node_rank))
                await link.send(start)
            except LinkError as e:
                run.ended(m, Outcome(Exit.CRASHED, f"executor on {m.host} went away: {e}"))
        job.link = members[0].link
        job.last_seen = now
        self._states.move(JobState.RUNNING, f"on {', '.join(plan)}, epoch {epoch}")
        return run

    def _procs_per_host(self, plan: list[str]) -> int:
        if self.placement.procs_per_host is not None:
            return self.placement.procs_per_host
        if self.spec.executor == "torch":
            return 1  # the torch kind trains one rank per host
        return max(1, min(self._inv.hosts[h].gpus for h in plan))

    def _default_backend(self, plan: list[str]) -> str:
        return "nccl" if all(self._inv.hosts[h].gpus > 0 for h in plan) else "gloo"

    def _epoch(self, members: list[Member], epoch: int) -> GroupEpoch:
        run = GroupEpoch(
            members,
            epoch=epoch,
            fleet=self._fleet,
            probe=self._probe,
            lease=self.lease,
            detection=self._detection,
            link=self.launcher.link,
            on_message=self._on_message,
            collective_timeout_s=self.collective_timeout_s,
            heartbeat_s=self._inv.console.heartbeat_s,
            noted=self._silent,
            unreachable=self._ready_replacement,
        )
        self.epoch_run = run
        return run

    # ------------------------------------------------------------- reattach

    async def _reattach(self) -> GroupEpoch | None:
        """A console started while the group had an epoch: take the members that still train
        it; a member that cannot be reached is waited out under the persisted lease bound
        (it may still be training), never taken for gone."""
        job = self.live
        if not job.rec.members or job.epoch == 0:
            return None
        self.lease.restore()
        plan = list(job.rec.members)
        self._assign(plan)
        members = [Member(r, h, until=self.lease.until) for r, h in enumerate(plan)]
        run = self._epoch(members, job.epoch)
        self.commits.new_epoch(job.epoch)
        for m in members:
            link = self.launcher.link(m.host)
            try:
                hello = await link.open(timeout=2)
            except LinkError:
                continue  # unreachable: its lease is waited out by the epoch's watch
            if hello.epoch == job.epoch and hello.state in ("training", "stopping"):
                m.link, m.last_seen, m.step = link, time.monotonic(), hello.step
                with contextlib.suppress(LinkError):
                    await link.send(run.grant(m))
            elif hello.epoch == job.epoch and hello.state == "faulted":
                self._warm.add(m.host)
                link.close()
                run.ended(m, Outcome(Exit.CRASHED, f"the run on {m.host} had ended"))
            else:
                await self._retire(link, m.host)
                link.close()
                run.ended(m, Outcome(Exit.CRASHED, f"no executor of epoch {job.epoch} on {m.host}"))
        linked = [m for m in members if m.link is not None]
        job.link = members[0].link
        if len(linked) == len(members):
            job.step = max(m.step for m in members)
            if job.incident is not None:  # a console restart: the group never stopped
                job.resumed_step = job.step
                self._incident.phase("loaded", step=job.step, last_step=job.step)
            self._journal.record(
                Kind.EXECUTOR,
                f"{self.name}: reattached to all {len(members)} members at epoch {job.epoch}",
                job=self.name,
                host=plan[0],
                data={"epoch": job.epoch, "members": plan},
            )
            self._states.move(JobState.RUNNING, "reattached")
        else:
            self._states.move(
                JobState.PENDING,
                f"{len(members) - len(linked)} member(s) not at epoch {job.epoch} at console "
                f"start: the group restarts once their lease ends "
                f"({max(0.0, self.lease.left()):.0f} s left at most)",
            )
        return run

    # ------------------------------------------------------------- messages

    def _on_message(self, m: Member, msg: ExecutorMessage) -> None:
        job = self.live
        if isinstance(msg, Heartbeat):
            self._fleet.seen(m.host)
            if m.node_rank == 0:
                job.last_seen = time.monotonic()
        elif isinstance(msg, Progress):
            if m.node_rank != 0:
                return
            job.last_seen = time.monotonic()
            job.step, job.loss, job.steps_per_s = msg.step, msg.loss, msg.steps_per_s
            job.history.append((clock.wall(), msg.step, msg.loss, msg.steps_per_s))
            resumed = job.resumed_step
            if job.incident is not None and resumed is not None and msg.step > resumed:
                self._incident.phase("first_step", step=msg.step)
                job.incident = None
            self._progress(msg)
        elif isinstance(msg, CheckpointSaved):
            self._on_checkpoint(m, msg)
        elif isinstance(msg, Resumed):
            if m.node_rank == 0:
                job.resumed_step = msg.step
                self._incident.phase(
                    "loaded", step=msg.step, load_s=msg.load_s, checkpoint=msg.checkpoint
                )
        elif isinstance(msg, Health):
            self._on_health(m, msg)
        elif isinstance(msg, Fault):
            job.log_tail.append(f"{_clock()} {m.host} FAULT {msg.fault}: {msg.message}")
            self._journal.record(
                Kind.FAULT,
                f"{self.name} on {m.host}: {msg.fault}: {msg.message}",
                job=self.name,
                host=m.host,
                data={"fault": msg.fault, "step": msg.step, "node_rank": m.node_rank},
            )
            if msg.fault == "preempted":
                self._open_incident(
                    m, "preemption", f"SIGTERM on {m.host}: checkpoint now, then move", planned=True
                )
        elif isinstance(msg, Log):
            job.log_tail.append(f"{_clock()} {m.host} {msg.level.upper()} {msg.text}")
        elif isinstance(msg, RunEnded):
            job.log_tail.append(f"{_clock()} {m.host} RUN ENDED {msg.fault}: {msg.message}")

    def _on_checkpoint(self, m: Member, msg: CheckpointSaved) -> None:
        job, man = self.live, msg.manifest
        # the path is derived from what the console knows, never taken from the host
        path = checkpoint_file(self._inv.host_root(m.host), self.name, man.step)
        self._journal.record(
            Kind.CHECKPOINT,
            f"{self.name}: shard {m.node_rank} of step {man.step} on {m.host}",
            job=self.name,
            host=m.host,
            data={
                "step": man.step,
                "bytes": man.size,
                "stall_s": msg.stall_s,
                "write_s": msg.write_s,
                "epoch": man.epoch,
                "shard": m.node_rank,
            },
        )
        if man.epoch != job.epoch:
            return
        self._replicator.submit(self.name, job.spares, Source(m.host, path, man, shard=m.node_rank))
        if self.commits.saved(m.node_rank, man.step, man.epoch) is None:
            return
        job.checkpoint, job.checkpoint_path = man, path
        job.checkpoints.append((m.host, man))
        self._journal.record(
            Kind.CHECKPOINT,
            f"{self.name}: step {man.step} committed (all {len(self.members)} shards written)",
            job=self.name,
            host=self.members[0],
            data={"step": man.step, "committed": True, "epoch": man.epoch},
        )
        if job.rec.restarts and man.step > (job.resumed_step or 0):
            job.rec.restarts = 0
            self._save()

    def _on_health(self, m: Member, msg: Health) -> None:
        fleet = self._fleet
        fleet.observe(m.host, msg)
        failing = fleet.failing(m.host)
        if failing and self.live.state is JobState.RUNNING and m.link is not None:
            why = "; ".join(f.message for f in failing)
            self._alert(f"{m.host}: GPU FAIL ({why}): draining it out of {self.name}", host=m.host)
            fleet.set_state(m.host, HostState.DRAINING, f"GPU FAIL: {why}")
            self._open_incident(m, "gpu_fail", f"GPU FAIL on {m.host}: {why}", planned=True)
            self._states.move(JobState.CHECKPOINTING, f"GPU FAIL on {m.host}")
            link = m.link
            asyncio.get_running_loop().create_task(
                self._send_quietly(link, Drain(reason="gpu_fail"))
            )

    async def _send_quietly(self, link: ExecutorLink, msg: Drain | Stop) -> None:
        with contextlib.suppress(LinkError):
            await link.send(msg)

    def _silent(self, m: Member, why: str) -> None:
        job = self.live
        if job.state in (JobState.RUNNING, JobState.CHECKPOINTING):
            self._states.move(JobState.UNREACHABLE, f"{m.host} silent: waiting out its lease")
        self._open_incident(m, "host_lost", f"{m.host}: {why}")

    def _open_incident(self, m: Member, fault_class: str, why: str, planned: bool = False) -> None:
        job = self.live
        if job.incident is not None:
            return
        # the incident names the member that failed, and its fault time is when it went silent
        rank0 = job.host, job.last_seen
        job.host, job.last_seen = m.host, m.last_seen
        try:
            self._incident.open(fault_class, why, planned=planned)
        finally:
            job.host, job.last_seen = rank0

    # --------------------------------------------------------------- recover

    async def _recover(self, run: GroupEpoch) -> tuple[int | None] | None:
        """Act on how the epoch ended: the committed step to resume from next (in a tuple: it
        may be None, step 0), or None when the job is over."""
        job, fleet = self.live, self._fleet
        members = run.members
        for m in members:
            assert m.exit is not None
            self._journal.record(
                Kind.EXECUTOR,
                f"{self.name}: member {m.node_rank} on {m.host} ended: {m.exit.said()}",
                job=self.name,
                host=m.host,
                data={"exit": m.exit.exit.value, "step": m.exit.step, "node_rank": m.node_rank},
            )
        exits = [m.exit.exit for m in members if m.exit is not None]
        job.link = None
        if all(e is Exit.FINISHED for e in exits):
            return self._finished(members)
        config = next((m for m in members if m.exit and m.exit.exit is Exit.CONFIG), None)
        if config is not None:
            assert config.exit is not None
            self._states.fail(FailureKind.CONFIG, f"{config.host}: {config.exit.why}")
            self._release()
            return None
        if job.stop_requested:
            job.rec.stopped = True
            self._save()
            self._states.fail(FailureKind.STOPPED, "stopped by an operator")
            self._release()
            return None
        first = run.origin() or members[0]
        assert first.exit is not None
        await self._keep_survivors_warm(members)
        for m in members:
            if m.exit is not None and m.exit.exit is Exit.HOST_LOST:
                fleet.set_state(m.host, HostState.DOWN, m.exit.why)
        replace = [m for m in members if not self._member_fit(m)]
        planned = any(m.exit is not None and m.exit.exit is Exit.PLANNED for m in members)
        cls = "host_lost" if first.exit.exit is Exit.HOST_LOST else first.exit.exit.value
        self._open_incident(first, cls, f"{first.host}: {first.exit.why}", planned=planned)
        if not replace and not planned:
            if job.rec.restarts < self._restart_limit:
                job.rec.restarts += 1
                self._save()
                self._states.move(
                    JobState.RESTARTING,
                    f"{first.host}: {first.exit.why}; restart {job.rec.restarts} of "
                    f"{self._restart_limit} in place",
                )
                self._incident.phase(
                    "decided", action="restart", host=first.host, last_step=self._last(members)
                )
                return (await self._resume_step([]),)
            replace = [first]
        if replace:
            self._states.move(
                JobState.FAILING_OVER,
                f"replacing {', '.join(m.host for m in replace)}: {first.exit.why}",
            )
            if not planned and not await self._approved(first):
                return None
            targets = await self._targets([m.host for m in replace])
            if targets is None:
                return None
            plan = list(self.members)
            for m, target in zip(replace, targets, strict=True):
                plan[m.node_rank] = target
            job.rec.restarts = 0
            for m in replace:
                if fleet.hosts[m.host].state is HostState.DRAINING:
                    fleet.set_state(m.host, HostState.DRAINED, f"{self.name} moved off")
            self._incident.phase(
                "decided",
                action="failover",
                host=", ".join(targets),
                last_step=self._last(members),
            )
            self._assign(plan)
        elif planned:
            self._states.move(JobState.RESTARTING, "planned stop: restarting the group")
            self._incident.phase(
                "decided", action="restart", host=first.host, last_step=self._last(members)
            )
        return (await self._resume_step([m.node_rank for m in replace]),)

    def _member_fit(self, m: Member) -> bool:
        """May this member's host take its rank again? Not once lost, failing a health rule,
        drained, or preempted (its executor was told its host is going away)."""
        assert m.exit is not None
        rt = self._fleet.hosts[m.host]
        if m.exit.exit is Exit.HOST_LOST or self._fleet.failing(m.host):
            return False
        if m.exit.exit is Exit.PLANNED and m.exit.why == "stopped for preempted":
            return False
        return rt.state in (HostState.UP, HostState.SUSPECT, HostState.CORDONED)

    def _last(self, members: list[Member]) -> int:
        saved = self.live.checkpoint.step if self.live.checkpoint is not None else 0
        steps = [m.exit.step or 0 for m in members if m.exit is not None]
        return max([self.live.step, saved, *steps])

    def _finished(self, members: list[Member]) -> None:
        job = self.live
        shas = {m.exit.sha256 for m in members if m.exit is not None}
        step = max(m.exit.step or 0 for m in members if m.exit is not None)
        if len(shas) != 1:
            self._states.fail(
                FailureKind.CRASH_LOOP,
                f"members finished with different parameters: {sorted(map(str, shas))}",
            )
            self._release()
            return None
        sha = shas.pop()
        job.sha256, job.step = sha, step
        job.rec.finished_sha256, job.rec.finished_step = sha, step
        self._save()
        self._states.move(JobState.FINISHED, f"step {step}")
        self._journal.record(
            Kind.FINISHED,
            f"{self.name}: finished at step {step} on {len(members)} hosts, params sha256 {sha}",
            job=self.name,
            host=members[0].host,
            data={"step": step, "params_sha256": sha, "members": [m.host for m in members]},
        )
        self._release()
        return None

    def _release(self) -> None:
        job, fleet = self.live, self._fleet
        for rt in fleet.hosts.values():
            if rt.job == self.name:
                rt.job = None
        job.spares = []
        fleet.changed.set()

    async def _approved(self, first: Member) -> bool:
        job = self.live
        decision = decide(self._policy(), failover=True, operator=job.target is not None)
        if decision is Decision.ACT:
            return True
        verb = "approve" if decision is Decision.ASK else "fail over by hand"
        assert first.exit is not None
        self._states.move(JobState.PENDING, f"waiting for an operator to {verb}: {first.exit.why}")
        self._alert(
            f"{self.name} needs {first.host} replaced ({first.exit.why}); {verb} in the console",
            job=self.name,
        )
        job.approval = asyncio.get_running_loop().create_future()
        approved = await job.approval
        job.approval = None
        if not approved:
            job.rec.stopped = True
            self._save()
            self._states.fail(FailureKind.STOPPED, "failover denied by an operator")
            self._release()
        return approved

    async def _targets(self, leaving: list[str]) -> list[str] | None:
        """A host for each member leaving: the job's spares, then the nearest usable hosts."""
        job, fleet = self.live, self._fleet
        while True:
            usable = fleet.usable(exclude=set(self.members))
            if job.target is not None and len(leaving) == 1:
                if job.target in usable:
                    return [job.target]
            else:
                chosen: list[str] = []
                for old in leaving:
                    readied = [h for h in self._readied if h in usable and h not in chosen]
                    spares = readied + [
                        s for s in job.spares if s in usable and s not in chosen + readied
                    ]
                    others = rank(
                        self._inv,
                        self._inv.hosts[old].region,
                        [
                            h
                            for h in usable
                            if h not in spares
                            and h not in chosen
                            and self._reserved().get(h) is None
                        ],
                    )
                    pick = (spares + others)[:1]
                    if not pick:
                        break
                    chosen.append(pick[0])
                if len(chosen) == len(leaving):
                    job.target = None
                    return chosen
            if job.stop_requested:
                self._stop_before_start()
                return None
            self._states.wait_note(f"no spare left for {self.name}: it waits for a host")
            await self._wait_for_hosts()

    # ------------------------------------------------------- resume, promote

    async def _resume_step(self, replaced: list[int]) -> int | None:
        """The newest whole step every member can load: a survivor from its own checkpoints, a
        new member from the replica of its shard on its host (promoted now). Whole: committed
        (every shard reported), or every member's shard of it on disk under one epoch (members
        that trained on while no console watched wrote steps none committed, and pruned the
        committed ones). None: no such step; the group starts from step 0."""
        committed = self.commits.steps()
        have = await asyncio.gather(
            *(self._shards_on(r, h, r in replaced) for r, h in enumerate(self.members))
        )
        common = set.intersection(*(set(h) for h in have)) if have else set()
        whole = [s for s in common if s in committed or len({h[s] for h in have}) == 1]
        step = max(whole, default=None)
        if step is None:
            if committed:
                self._alert(
                    f"{self.name}: no committed step (newest {committed[0]}) is held by every "
                    "member: starting again from step 0",
                    job=self.name,
                )
            return None
        for r in replaced:
            host = self.members[r]
            try:
                await promote(
                    self._fleet.hosts[host].transport,
                    self._inv.python(host),
                    self._replica_folder(host, r),
                    posixpath.join(self.launcher.workdir(host), "checkpoints"),
                    step,
                )
            except TransportError as e:
                self._alert(
                    f"{self.name}: promoting shard {r} on {host} failed: {e}", job=self.name
                )
        self._incident.phase("transfer_done", host=",".join(self.members), replica_step=step)
        return step

    def _replica_folder(self, host: str, shard: int) -> str:
        return replica_dir(self._inv.host_root(host), shard_key(self.name, shard))

    async def _shards_on(self, shard: int, host: str, replica: bool) -> dict[int, int]:
        """Steps of ``shard`` that ``host`` holds complete (replicas, or its own checkpoints),
        each with the epoch it was written under."""
        folder = (
            self._replica_folder(host, shard)
            if replica
            else posixpath.join(self.launcher.workdir(host), "checkpoints")
        )
        try:
            found = await list_manifests(
                self._fleet.hosts[host].transport, self._inv.python(host), folder
            )
        except TransportError:
            return {}
        return {
            m.step: m.epoch for m in found if m.node_rank == shard and m.nnodes == len(self.members)
        }

    # ------------------------------------------------------------ warm survivors

    async def _keep_survivors_warm(self, members: list[Member]) -> None:
        """Survivors whose run ended wait, warm, for the next Start: link them and keep them
        under lease while the group recovers (a lost member's lease is waited out first)."""
        for m in members:
            if m.exit is None or m.exit.exit is not Exit.CRASHED or m.host in self._warm:
                continue
            link = self.launcher.link(m.host)
            try:
                hello = await link.open(timeout=2)
            except LinkError:
                continue
            if hello.state == "faulted":
                self._warm.add(m.host)
            link.close()
        if self._warm and self._keeping is None:
            self._keeping = asyncio.create_task(self._keep())

    async def _keep(self) -> None:
        """A fresh link each time: its Hello is the clock reading the renewal is anchored to."""
        epoch = self.live.epoch
        while True:
            for host in list(self._warm):
                link = self.launcher.link(host)
                try:
                    hello = await link.open(timeout=2)
                    if hello.state == "faulted" and hello.epoch == epoch:
                        await link.send(self.lease.renewal(link, host, epoch))
                    else:
                        self._warm.discard(host)
                except LinkError:
                    self._warm.discard(host)
                finally:
                    link.close()
            await asyncio.sleep(KEEP_WARM_S)

    async def _stop_keeping(self) -> None:
        task, self._keeping = self._keeping, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
