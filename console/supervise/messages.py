"""What a job's executor says, and what is done about it: a single host's messages, and a
read-only console's view of any job (which acts on nothing).

Progress moves the job's step and closes an incident once training got past where it resumed;
a checkpoint is journalled and replicated to the spares; a GPU failing a health rule drains the
host and moves the job; a preemption, a NaN or an OOM opens its incident; a config fault, a
finish, a stop or a run that ended under a live executor say how the run ended (``exit``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from console.fleet.hosts import Fleet
from console.inventory import Inventory
from console.reach.deploy import checkpoint_file
from console.records.journal import Journal
from console.replication.replicator import Replicator, Source
from console.states import JobState
from console.supervise.gpu_health import GpuWatch
from console.supervise.heard import Heard
from console.supervise.incident import OpenIncident
from console.supervise.lease import JobLease
from console.supervise.live import Alert, LiveJob
from console.supervise.outcome import Exit, Outcome, from_finished, from_run_ended, from_stopped
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
    Stopped,
)


class JobMessages:
    """Where a single-host job's messages go (``on_message``), given what they update."""

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
        move: Callable[[StopReason, str], None],
        acts: bool = True,
    ) -> None:
        self._live = live
        self._inv = inv
        self._fleet = fleet
        self._alert = alert
        self._replicator = replicator
        self._incident = incident
        self._move = move
        """Ask for a planned move off the host: (reason, why)."""
        self._acts = acts
        """False for a read-only console: messages update the view, and nothing is done about
        them (no incident opened, no drain, no restart count reset)."""
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
        """What the host's GPU health asks of the job, as for every job's hosts."""
        self.ended = asyncio.Event()
        """Set when a message says the run ended while the executor stays (``RunEnded``)."""
        self._said = JobSaid(live, journal=journal, incident=incident, progress=progress, save=save)
        """What it says that updates the job, as for every job's rank 0."""

    def new_executor(self) -> None:
        """Another executor, another clock: its pace is measured afresh."""
        if self._live.host is not None:
            self._heard.new_executor(self._live.host)

    def on_message(self, msg: ExecutorMessage) -> None:
        job = self._live
        assert job.host is not None
        if isinstance(msg, Heartbeat):
            job.last_seen = time.monotonic()
            self._fleet.seen(job.host)
            self._heard.clock(job.host, msg.clock)
        elif isinstance(msg, Progress):
            self._said.progressed(msg)
        elif isinstance(msg, CheckpointSaved):
            job.checkpoint = msg.manifest
            job.checkpoint_path = checkpoint_file(
                self._inv.host_root(job.host), job.name, msg.manifest.step
            )
            job.checkpoints.append((job.host, msg.manifest))
            self._said.checkpoint(job.host, msg)
            if msg.manifest.epoch == job.epoch:
                self._replicator.submit(
                    job.name, job.spares, Source(job.host, job.checkpoint_path, msg.manifest)
                )
                if self._acts:  # one host's checkpoint is whole when written
                    self._said.committed(msg.manifest.step, job.host)
        elif isinstance(msg, Resumed):
            self._said.resumed(msg)
        elif isinstance(msg, Health):
            self._on_health(msg)
        elif isinstance(msg, Fault):
            self._said.line(f"FAULT {msg.fault}: {msg.message}")
            self._on_fault(msg)
        elif isinstance(msg, Log):
            self._said.line(f"{msg.level.upper()} {msg.text}")
            self._heard.log(job.host, msg)
        elif isinstance(msg, Finished):
            job.exit = from_finished(msg.step, msg.params_sha256, msg.warnings)
            self._incident.finished(msg.step)
        elif isinstance(msg, Stopped):
            job.exit = from_stopped(msg.reason, msg.step, msg.checkpoint_step)
        elif isinstance(msg, RunEnded):  # the executor stays: a restart in place needs no new one
            self._said.line(f"RUN ENDED {msg.fault}: {msg.message}")
            job.exit = from_run_ended(msg.fault, msg.message, msg.step)
            job.faulted = job.link
            self.ended.set()

    def _on_fault(self, msg: Fault) -> None:
        job = self._live
        assert job.host is not None
        self._heard.fault(job.host, msg, job.link)
        if not self._acts:
            return
        self._incident.of_fault(msg, job.host, job.last_seen)
        if msg.fault == FaultKind.CONFIG:
            job.exit = Outcome(Exit.CONFIG, msg.message)

    def _on_health(self, msg: Health) -> None:
        job = self._live
        host = job.host
        assert host is not None
        call = self._gpu.heard(host, msg)
        if call is None or job.state is not JobState.RUNNING:
            return
        self._alert(self._gpu.mark(call, host, job.name, job.leave), host=host)
        if call.acts:
            self._move(call.move, call.said(host))
