"""What a multi-host job's members say, and the incident a member's failure opens.

Rank 0's progress is the job's; every member's heartbeat keeps its host seen; each shard a
member checkpoints is replicated to the spares, and a step is committed once every member's
shard of it is written. A member failing a health rule is drained out of the group (GPU FAIL).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

from console.fleet.hosts import Fleet
from console.fleet.link import ExecutorLink, LinkError
from console.inventory import Inventory
from console.reach.deploy import checkpoint_file
from console.records.journal import Journal, Kind
from console.replication.replicator import Replicator, Source
from console.states import JobState
from console.supervise.gpu_health import GpuWatch
from console.supervise.group.commit import Commits
from console.supervise.group.epoch import Member
from console.supervise.heard import Heard
from console.supervise.incident import OpenIncident
from console.supervise.lease import JobLease
from console.supervise.live import Alert, LiveJob, Transitions
from console.supervise.policy import Policy
from console.supervise.said import JobSaid
from protocol.faults import FaultKind
from protocol.messages import (
    CheckpointSaved,
    Drain,
    ExecutorMessage,
    Fault,
    Finished,
    Health,
    Heartbeat,
    Log,
    Progress,
    Resumed,
    RunEnded,
    Stop,
)


async def send_quietly(link: ExecutorLink, msg: Drain | Stop) -> None:
    """Send, unless the link is gone (then what it would have ordered no longer matters)."""
    with contextlib.suppress(LinkError):
        await link.send(msg)


class MemberMessages:
    """Where each member's messages go in an epoch, and what a member's silence or failure opens."""

    def __init__(
        self,
        live: LiveJob,
        *,
        states: Transitions,
        inv: Inventory,
        fleet: Fleet,
        journal: Journal,
        alert: Alert,
        incident: OpenIncident,
        replicator: Replicator,
        commits: Commits,
        save: Callable[[], object],
        progress: Callable[[Progress], None],
        members: Callable[[], list[str]],
        refused: Callable[[str, int], None],
        lease: JobLease,
        policy: Callable[[], Policy],
    ) -> None:
        self._live = live
        self._heard = Heard(
            live.name,
            journal=journal,
            alert=alert,
            lease=lease,
            lease_s=inv.console.lease_s,
            skew_s=inv.console.clock_skew_s,
        )
        """Each member's warnings and faults journalled and clock checked, as for every job's
        executors (a lost lease's fault with the job's lease evidence)."""
        self._newest: dict[int, Source] = {}
        """Each member's newest shard written this epoch, by node rank."""
        self._gpu = GpuWatch(fleet, policy)
        """What a member's GPU health asks of its rank, as for every job's hosts."""
        self._before = JobState.RUNNING
        """What the job read before a member's silence made it unreachable."""
        self._name = live.name
        self._states = states
        self._inv = inv
        self._fleet = fleet
        self._journal = journal
        self._alert = alert
        self._incident = incident
        self._replicator = replicator
        self._commits = commits
        self._members = members
        """The job's hosts now, by node rank."""
        self._said = JobSaid(live, journal=journal, incident=incident, progress=progress, save=save)
        """What members say that updates the job, as for a single host's executor."""
        self._refused = refused
        """A member on this host could not load this step: the next resume chooses another."""

    def new_epoch(self, hosts: list[str]) -> None:
        """An epoch starts on ``hosts``: a member's executor may be new (a replacement), so
        each clock's pace is measured afresh."""
        self._newest.clear()
        for host in hosts:
            self._heard.new_executor(host)

    def send_newest(self, spares: list[str]) -> None:
        """Every member's newest shard of this epoch to new spares (the spare keeper's)."""
        for source in self._newest.values():
            self._replicator.submit(self._name, spares, source)

    def on_message(self, m: Member, msg: ExecutorMessage) -> None:
        job = self._live
        if isinstance(msg, Heartbeat):
            self._fleet.seen(m.host)
            self._heard.clock(m.host, msg.clock)
            if m.node_rank == 0:
                job.last_seen = time.monotonic()
        elif isinstance(msg, Progress):
            if m.node_rank == 0:
                self._said.progressed(msg)
        elif isinstance(msg, CheckpointSaved):
            self._on_checkpoint(m, msg)
        elif isinstance(msg, Resumed):
            if m.node_rank == 0:
                self._said.resumed(msg)
        elif isinstance(msg, Health):
            self._on_health(m, msg)
        elif isinstance(msg, Fault):
            self._said.line(f"FAULT {msg.fault}: {msg.message}", m.host)
            self._heard.fault(m.host, msg, m.link, node_rank=m.node_rank)
            if msg.fault == FaultKind.RESUME_FAILED:
                self._refused(m.host, msg.step)
            self._incident.of_fault(msg, m.host, m.last_seen)
        elif isinstance(msg, Log):
            self._said.line(f"{msg.level.upper()} {msg.text}", m.host)
            self._heard.log(m.host, msg)
        elif isinstance(msg, RunEnded):
            self._said.line(f"RUN ENDED {msg.fault}: {msg.message}", m.host)
        elif isinstance(msg, Finished) and m.node_rank == 0:
            self._incident.finished(msg.step)

    def _on_checkpoint(self, m: Member, msg: CheckpointSaved) -> None:
        job, man = self._live, msg.manifest
        # the path is derived from what the console knows, never taken from the host
        path = checkpoint_file(self._inv.host_root(m.host), self._name, man.step)
        self._said.checkpoint(m.host, msg, shard=m.node_rank)
        if man.epoch != job.epoch:
            return
        source = Source(m.host, path, man, shard=m.node_rank)
        self._newest[m.node_rank] = source
        self._replicator.submit(self._name, job.spares, source)
        if self._commits.saved(m.node_rank, man.step, man.epoch) is None:
            return
        job.checkpoint, job.checkpoint_path = man, path
        job.checkpoints.append((m.host, man))
        members = self._members()
        self._journal.record(
            Kind.CHECKPOINT,
            f"{self._name}: step {man.step} committed (all {len(members)} shards written)",
            job=self._name,
            host=members[0],
            data={"step": man.step, "committed": True, "epoch": man.epoch},
        )
        self._said.committed(man.step, members[0])

    def _on_health(self, m: Member, msg: Health) -> None:
        call = self._gpu.heard(m.host, msg)
        if call is None or self._live.state is not JobState.RUNNING or m.link is None:
            return
        self._alert(self._gpu.mark(call, m.host, self._name, self._live.leave), host=m.host)
        if not call.acts:
            return
        self.open_incident(m, call.move.value, call.said(m.host), planned=True)
        self._states.move(JobState.CHECKPOINTING, call.said(m.host))
        link = m.link
        asyncio.get_running_loop().create_task(send_quietly(link, Drain(reason=call.move)))

    def silent(self, m: Member) -> None:
        """``m`` went silent: the job waits out its lease (it reads unreachable meanwhile)."""
        job = self._live
        if job.state in (JobState.RUNNING, JobState.CHECKPOINTING):
            self._before = job.state
            self._states.move(JobState.UNREACHABLE, f"{m.host} silent: waiting out its lease")

    def answered(self, m: Member, linked: list[Member]) -> None:
        """``m`` answers again after a silence (a blip): once no member of the epoch is
        silent, the job reads as it did before."""
        job = self._live
        if job.state is JobState.UNREACHABLE and all(x.link is not None for x in linked):
            self._states.move(self._before, f"{m.host} answers again")

    def lost(self, m: Member, why: str, fault_class: str) -> None:
        """``m``'s silence is decided a loss (its lease ran out; ``host_lost``: its host cannot
        be reached, ``executor_hang``: it can, the executor is frozen): an incident names it,
        dated from its last heartbeat. A silence that ends in a relink is a blip, none opens."""
        self.open_incident(m, fault_class, f"{m.host}: {why}")

    def open_incident(self, m: Member, fault_class: str, why: str, planned: bool = False) -> None:
        # the incident names the member that failed, and its fault time is when it went silent
        self._incident.open(fault_class, why, planned=planned, member=(m.host, m.last_seen))
