"""What a job's executors say, and what is done about it: one dispatcher for a single host's
executor (node rank 0 of a group of one) and a group's members, and a read-only console's view
of any job (which acts on nothing).

- rank 0's progress and resume are the job's (``JobSaid``); every executor's heartbeat keeps
  its host seen, its clock checked and its warnings journalled (``Heard``);
- a checkpoint is journalled and replicated to the spares; it is the job's once it is whole:
  a single host's at once, a group's once every member's shard of the step is written
  (``Commits``, two-phase);
- a GPU failing a health rule moves the executor's rank off its host (``move``: the job, or
  one member's rank), a preemption, a NaN or an OOM opens the job's incident;
- a finish, a stop, a run that ended under a live executor or a configuration fault is the
  run's end, returned to whoever watches the executor (``GroupEpoch``), which
  keeps its own account of it.

Found in the merge of the two dispatchers (issue 30): a single host's and a group's were two
copies that differed in more than the kind asks (the order of a checkpoint's effects, which
messages a read-only console acted on), and each new message had to be added twice.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from console.fleet.hosts import Fleet
from console.inventory import Inventory
from console.reach.deploy import checkpoint_file
from console.records.journal import Journal, Kind
from console.replication.replicator import Replicator, Source, rank_shard
from console.states import JobState
from console.supervise.gpu_health import GpuWatch
from console.supervise.group.commit import Commits
from console.supervise.heard import Heard
from console.supervise.incident import OpenIncident
from console.supervise.lease import JobLease
from console.supervise.live import Alert, LiveJob
from console.supervise.member import Member
from console.supervise.outcome import Outcome, run_end
from console.supervise.policy import Policy
from console.supervise.said import JobSaid
from protocol.faults import FaultKind, StopReason
from protocol.messages import (
    CheckpointSaved,
    ExecutorMessage,
    Fault,
    Finished,
    Health,
    Heartbeat,
    Log,
    Progress,
    Resumed,
    RunEnded,
)


class JobMessages:
    """Where a job's executors' messages go (``on_message``), given what they update."""

    def __init__(
        self,
        live: LiveJob,
        *,
        inv: Inventory,
        fleet: Fleet,
        journal: Journal,
        alert: Alert,
        policy: Callable[[], Policy],
        lease: JobLease,
        save: Callable[[], object],
        replicator: Replicator,
        incident: OpenIncident,
        progress: Callable[[Progress], None],
        move: Callable[[Member, StopReason, str], None],
        members: Callable[[], list[str]],
        commits: Commits | None = None,
        refused: Callable[[str, int], None] = lambda _host, _step: None,
        acts: bool = True,
    ) -> None:
        self._live = live
        self._inv = inv
        self._fleet = fleet
        self._journal = journal
        self._alert = alert
        self._replicator = replicator
        self._incident = incident
        self._move = move
        """Move an executor's rank off its host for its GPU's health: (executor, reason, why)."""
        self._members = members
        """The job's hosts now, by node rank."""
        self._commits = commits
        """A group's two-phase commit; None: one host's checkpoint is whole when written."""
        self._refused = refused
        """A member on this host could not load this step: the next resume chooses another."""
        self._acts = acts
        """False for a read-only console: messages update the view, and nothing is done about
        them (no incident opened, no drain, no restart count reset)."""
        self._newest: dict[int, Source] = {}
        """Each executor's newest checkpoint (a group's: shard) written this epoch, by node rank;
        a single host's executor's, the one it resumed from until it writes one."""
        self._heard = Heard(
            live.name,
            journal=journal,
            alert=alert,
            lease=lease,
            lease_s=inv.console.lease_s,
            skew_s=inv.console.clock_skew_s,
        )
        """Warnings journalled and clocks checked, as for every job's executors."""
        self._gpu = GpuWatch(fleet, policy, acts=acts)
        """What an executor's GPU health asks of its rank, as for every job's hosts."""
        self._said = JobSaid(live, journal=journal, incident=incident, progress=progress, save=save)
        """What rank 0 says that updates the job."""

    @property
    def _group(self) -> bool:
        """A job on several hosts: lines and faults name the member, checkpoints are shards
        (a job on one host, supervised as a group of one, keeps a single host's wording and
        its replicas whole, in ``replicas/JOB``: one layout for its spares however it runs)."""
        return self._inv.multi_host(self._live.name)

    def new_epoch(self, hosts: list[str]) -> None:
        """An epoch starts on ``hosts`` (one host's, a group's members): each executor may be
        new (a replacement), another clock whose pace is measured afresh; each one's newest
        checkpoint is the one it resumes from or writes."""
        self._newest.clear()
        for host in hosts:
            self._heard.new_executor(host)

    def send_newest(self, spares: list[str]) -> None:
        """Every executor's newest checkpoint of this epoch to new spares (the spare keeper's,
        one path for both kinds), each from the host that holds it now."""
        for source in self._newest.values():
            self._replicator.submit(self._live.name, spares, source)

    def newest(self, rank: int) -> Source | None:
        """Node rank ``rank``'s newest checkpoint of this epoch (or the one it resumed from),
        on the host that holds it."""
        return self._newest.get(rank)

    def newest_step(self, m: Member) -> int:
        """The newest step ``m``'s executor is known to have checkpointed: its own of this
        epoch, or the job's newest whole checkpoint (-1: none)."""
        own = self._newest.get(m.node_rank)
        job = self._live.checkpoint
        return max(own.manifest.step if own else -1, job.step if job is not None else -1)

    def on_message(self, m: Member, msg: ExecutorMessage) -> Outcome | None:
        """What ``m``'s executor said, done; the run's end if it says its run ended."""
        job, host, first = self._live, m.host, m.node_rank == 0
        if isinstance(msg, Heartbeat):
            self._fleet.seen(host)
            self._heard.clock(host, msg.clock)
            if first:
                job.last_seen = time.monotonic()
        elif isinstance(msg, Progress):
            if first:
                self._said.progressed(msg)
        elif isinstance(msg, CheckpointSaved):
            self._on_checkpoint(m, msg)
        elif isinstance(msg, Resumed):
            if first:
                self._said.resumed(msg)
            self._resumed_from(m, msg)
        elif isinstance(msg, Health):
            self._on_health(m, msg)
        elif isinstance(msg, Fault):
            self._line(f"FAULT {msg.fault}: {msg.message}", host)
            self._on_fault(m, msg)
        elif isinstance(msg, Log):
            self._line(f"{msg.level.upper()} {msg.text}", host)
            self._heard.log(host, msg)
        elif isinstance(msg, RunEnded):  # the executor stays: a restart in place needs no new one
            self._line(f"RUN ENDED {msg.fault}: {msg.message}", host)
        elif isinstance(msg, Finished) and first:
            self._incident.finished(msg.step)
        return run_end(msg)

    def _line(self, text: str, host: str) -> None:
        self._said.line(text, host if self._group else None)

    def _on_fault(self, m: Member, msg: Fault) -> None:
        rank = {"node_rank": m.node_rank} if self._group else {}
        self._heard.fault(m.host, msg, m.link, **rank)
        if not self._acts:
            return
        if msg.fault == FaultKind.RESUME_FAILED:
            self._refused(m.host, msg.step)
        self._incident.of_fault(msg, m.host, m.last_seen)

    def _on_checkpoint(self, m: Member, msg: CheckpointSaved) -> None:
        job, man = self._live, msg.manifest
        shard = rank_shard(self._group, m.node_rank)
        # the path is derived from what the console knows, never taken from the host
        path = checkpoint_file(self._inv.host_root(m.host), job.name, man.step)
        self._said.checkpoint(m.host, msg, shard=shard)
        current = man.epoch == job.epoch
        if current:
            source = Source(m.host, path, man, shard=shard)
            self._newest[m.node_rank] = source
            self._replicator.submit(job.name, job.spares, source)
        if self._commits is None:  # one host's checkpoint is whole when written
            job.checkpoint, job.checkpoint_path = man, path
            job.checkpoints.append((m.host, man))
            if current and self._acts:
                self._said.committed(man.step, m.host)
            return
        if not current or self._commits.saved(m.node_rank, man.step, man.epoch) is None:
            return
        job.checkpoint, job.checkpoint_path = man, path
        job.checkpoints.append((m.host, man))
        members = self._members()
        if self._group:  # a group of one's one shard is its checkpoint, whole: as one host's
            self._journal.record(
                Kind.CHECKPOINT,
                f"{job.name}: step {man.step} committed (all {len(members)} shards written)",
                job=job.name,
                host=members[0],
                data={"step": man.step, "committed": True, "epoch": man.epoch},
            )
        self._said.committed(man.step, members[0])

    def _resumed_from(self, m: Member, msg: Resumed) -> None:
        """A single host's executor resumed from the job's newest checkpoint: it lies in that
        host's own checkpoints now (promoted there, or written there), so that is where a new
        spare's copy is taken from. The path the host that wrote it used, on the host the job
        moved to, was sent instead (another root: no such file), and nothing reached a spare
        taken between a failover and the first checkpoint after it. (A group's members each
        resume a shard of their own; a new spare gets this epoch's shards as they are written.)"""
        job, man = self._live, self._live.checkpoint
        if self._group or man is None or man.step != msg.step or msg.epoch != job.epoch:
            return
        path = checkpoint_file(self._inv.host_root(m.host), job.name, man.step)
        job.checkpoint_path = path
        self._newest[m.node_rank] = Source(m.host, path, man)

    def _on_health(self, m: Member, msg: Health) -> None:
        job = self._live
        call = self._gpu.heard(m.host, msg)
        if call is None or job.state is not JobState.RUNNING or m.link is None:
            return
        self._alert(self._gpu.mark(call, m.host, job.name, job.leave), host=m.host)
        if call.acts:
            self._move(m, call.move, call.said(m.host))
