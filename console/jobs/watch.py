"""What a job supervisor watches while its executor runs, and how it reads a lost link.

Messages update the job; a dropped link is relinked after a blip, or classified (crash,
hang, host lost) once the executor is known dead or its lease has surely ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import posixpath
import time
from typing import TYPE_CHECKING

from console import clock
from console.fleet.detect import is_suspect
from console.fleet.link import ExecutorLink, LinkError
from console.jobs.outcome import Exit, Outcome, from_events_tail, from_stopped
from console.jobs.policy import Decision, decide
from console.jobs.replicator import Source
from console.reach.deploy import checkpoint_file, job_dir
from console.reach.remote import KillStatus, executor_alive, kill_executor
from console.reach.transport.base import TransportError
from console.records.journal import Kind
from console.states import HostState, JobState
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
    Stopped,
)

if TYPE_CHECKING:
    from console.jobs.supervisor import JobSupervisor

POLL_S = 0.2
PROBE_MIN_S = 2.0
TAIL_BYTES = 64 * 1024


def _clock() -> str:
    return time.strftime("%H:%M:%S")


class Watch:
    """Mixed into JobSupervisor: messages, liveness and what a lost link means."""

    def _on_message(self: JobSupervisor, msg: ExecutorMessage) -> None:
        assert self.host is not None
        if isinstance(msg, Heartbeat):
            self.last_seen = time.monotonic()
            self.ctl.fleet.seen(self.host)
            self._check_pace(msg.clock)
        elif isinstance(msg, Progress):
            self.last_seen = time.monotonic()
            self.step, self.loss, self.steps_per_s = msg.step, msg.loss, msg.steps_per_s
            self.history.append((clock.wall(), msg.step, msg.loss, msg.steps_per_s))
            if (
                self.incident is not None
                and self.resumed_step is not None
                and msg.step > self.resumed_step
            ):
                self._phase("first_step", step=msg.step)
                self.incident = None
            self.ctl.on_progress(self, msg)
        elif isinstance(msg, CheckpointSaved):
            self.checkpoint = msg.manifest
            self.checkpoint_path = checkpoint_file(
                self.ctl.inv.host_root(self.host), self.name, msg.manifest.step
            )
            self.checkpoints.append((self.host, msg.manifest))
            self.ctl.journal.record(
                Kind.CHECKPOINT,
                f"{self.name}: checkpoint step {msg.manifest.step} on {self.host}",
                job=self.name,
                host=self.host,
                data={
                    "step": msg.manifest.step,
                    "bytes": msg.manifest.size,
                    "stall_s": msg.stall_s,
                    "write_s": msg.write_s,
                    "epoch": msg.manifest.epoch,
                },
            )
            if msg.manifest.epoch == self.epoch:
                self.ctl.replicator.submit(
                    self.name, self.spares, Source(self.host, self.checkpoint_path, msg.manifest)
                )
                if self.rec.restarts and msg.manifest.step > (self.resumed_step or 0):
                    self._restarts_paid_off(msg.manifest.step)
        elif isinstance(msg, Resumed):
            self.resumed_step = msg.step
            self._phase("loaded", step=msg.step, load_s=msg.load_s, checkpoint=msg.checkpoint)
        elif isinstance(msg, Health):
            self._on_health(msg)
        elif isinstance(msg, Fault):
            self.log_tail.append(f"{_clock()} FAULT {msg.fault}: {msg.message}")
            self._on_fault(msg)
        elif isinstance(msg, Log):
            self.log_tail.append(f"{_clock()} {msg.level.upper()} {msg.text}")
        elif isinstance(msg, Finished):
            self.exit = Outcome(Exit.FINISHED, "finished", msg.step, sha256=msg.params_sha256)
        elif isinstance(msg, Stopped):
            self.exit = from_stopped(msg.reason, msg.step, msg.checkpoint_step)

    def _check_pace(self: JobSupervisor, executor_clock: float) -> None:
        drift = self.pace.sample(executor_clock, clock.mono())
        skew = self.ctl.inv.console.clock_skew_s
        if drift is not None and abs(drift) > skew:
            self.ctl.alert(
                f"{self.host}: its clock and the console's drifted {drift:+.2f} s apart over one "
                f"lease, more than clock_skew_s ({skew:g} s): leases may not hold; raise "
                "clock_skew_s or check the host's clock",
                host=self.host,
            )

    def _restarts_paid_off(self: JobSupervisor, step: int) -> None:
        """A checkpoint past the step a restart resumed from: the job got over that crash, so
        ``restart_limit`` counts again from zero (it bounds a crash loop, not crashes ever)."""
        self.ctl.journal.record(
            Kind.EXECUTOR,
            f"{self.name}: checkpoint at step {step} after {self.rec.restarts} restart(s); "
            "the restart count starts again",
            job=self.name,
            host=self.host,
            data={"restarts": self.rec.restarts, "step": step},
        )
        self.rec.restarts = 0
        self.ctl.store.save()

    def _on_fault(self: JobSupervisor, msg: Fault) -> None:
        assert self.host is not None
        self.ctl.journal.record(
            Kind.FAULT,
            f"{self.name} on {self.host}: {msg.fault}: {msg.message}",
            job=self.name,
            host=self.host,
            data={"fault": msg.fault, "step": msg.step},
        )
        if msg.fault == "preempted" and self.incident is None:
            self._open_incident("preemption", "SIGTERM: checkpoint now, then migrate", planned=True)
        if msg.fault in ("nan", "oom") and self.incident is None:
            self._in_executor_incident(msg.fault, msg.step, msg.message)
        if msg.fault == "config":
            self.exit = Outcome(Exit.CONFIG, msg.message)

    def _on_health(self: JobSupervisor, msg: Health) -> None:
        assert self.host is not None
        fleet = self.ctl.fleet
        fleet.observe(self.host, msg)
        failing = fleet.failing(self.host)
        if failing and self.state is JobState.RUNNING:
            why = "; ".join(f.message for f in failing)
            self.ctl.alert(
                f"{self.host}: GPU FAIL ({why}): draining and moving {self.name}", host=self.host
            )
            fleet.set_state(self.host, HostState.DRAINING, f"GPU FAIL: {why}")
            self.request_move("gpu_fail", f"GPU FAIL on {self.host}: {why}")
        warns = [
            f
            for f in fleet.hosts[self.host].findings
            if f.rule in ("throttle", "temperature", "pcie_replays")
        ]
        self._warned = self._warned + 1 if warns else 0
        if self._warned == 5 and self.ctl.policy.value == "auto" and self.state is JobState.RUNNING:
            self.request_move("migrate", f"GPU WARN on {self.host}: {warns[0].message}")

    # ------------------------------------------------------- after link loss

    async def _after_link_loss(self: JobSupervisor, why: str) -> Outcome | None:
        """Relink after a blip; otherwise find out what happened, waiting out the lease where it matters.

        Probes are cut short near the lease's end, so the decision follows the end closely.
        """
        host = self.host
        assert host is not None
        workdir = job_dir(self.ctl.inv.host_root(host), self.name)
        suspect_noted = offline_noted = probed = False
        alive: bool | None = None
        probe_s = max(0.5, 2 * self.ctl.inv.console.heartbeat_s)
        while True:
            silent = is_suspect(time.monotonic(), self.last_seen, self.ctl.detection)
            if probed and silent and self.lease.ended():
                if alive:
                    await self._kill(host, workdir)
                    return Outcome(Exit.HUNG, f"executor on {host} stopped answering")
                if await self.ctl.fleet.console_online(excluding=host):
                    return Outcome(Exit.HOST_LOST, f"{host} unreachable past its lease: {why}")
                if not offline_noted:
                    offline_noted = True
                    self.ctl.alert(
                        f"the console reaches no host at all: not failing {self.name} over",
                        job=self.name,
                    )
            budget = max(0.2, min(probe_s, self.lease.left())) if silent else probe_s
            if await self._relink(host, budget):
                await self._cancel_preparation()
                return None
            # The probe runs a short Python program on the host, which a loaded host may take a
            # while to start; one cut short reads as "cannot be asked", not as "gone". Only
            # near the lease's end is it cut short, so the decision follows the end closely.
            alive = await self._probe_alive(host, workdir, budget if silent else PROBE_MIN_S)
            probed = True
            if alive is False:
                return await self._exit_from_workdir(host)
            if silent and not suspect_noted:
                suspect_noted = True
                self.ctl.fleet.set_state(host, HostState.SUSPECT, f"no heartbeat: {why}")
                self._open_incident("host_lost" if alive is None else "executor_hang", why)
            if (
                alive is None
                and self._preparing is None
                and decide(self.ctl.policy, failover=True) is Decision.ACT
            ):
                # Unreachable: ready the target now (an idle executor trains nothing); a blip cancels it.
                self._preparing = asyncio.create_task(self._prepare_failover(host))
            await asyncio.sleep(POLL_S)

    async def _relink(self: JobSupervisor, host: str, budget: float) -> bool:
        """Reconnect to the same executor (same epoch, still training): the loss was a blip."""
        link = ExecutorLink(
            self.ctl.fleet.hosts[host].transport, self._socket(host), self.ctl.console_id
        )
        try:
            async with asyncio.timeout(budget):
                hello = await link.open(timeout=budget)
        except (LinkError, TimeoutError):
            link.close()
            return False
        if hello.epoch == self.epoch and hello.state in ("training", "stopping"):
            self.link = link
            self.last_seen = time.monotonic()
            with contextlib.suppress(LinkError):  # at once: the lease may be about to end
                await link.send(self.lease.renewal(link, host, self.epoch))
            return True
        link.close()
        return False

    async def _probe_alive(
        self: JobSupervisor, host: str, workdir: str, budget: float
    ) -> bool | None:
        """Is the executor alive (lock held)? None when the host cannot be asked within ``budget``."""
        try:
            async with asyncio.timeout(budget):
                return await executor_alive(
                    self.ctl.fleet.hosts[host].transport,
                    self.ctl.inv.python(host),
                    workdir,
                    timeout=budget,
                )
        except (TransportError, TimeoutError):
            return None

    async def _kill(self: JobSupervisor, host: str, workdir: str) -> None:
        """End a hung executor by the pid that holds its workdir's lock, never by a name pattern
        (one would match another job's executor whose workdir shares a prefix); the outcome is
        journaled, and a kill that did not happen is an alert."""
        try:
            result = await kill_executor(
                self.ctl.fleet.hosts[host].transport, self.ctl.inv.python(host), workdir
            )
        except TransportError as e:
            self.ctl.alert(
                f"{self.name}: could not kill the hung executor on {host}: {e}",
                job=self.name,
                host=host,
            )
            return
        self.ctl.journal.record(
            Kind.EXECUTOR,
            f"{self.name}: killing the hung executor on {host}: {result.why}",
            job=self.name,
            host=host,
            data={
                "kill": result.status.name.lower(),
                "pid": result.pid,
                "holders": result.holders,
                "reaped": result.reaped,
            },
        )
        if result.status not in (KillStatus.KILLED, KillStatus.NOT_HELD):
            self.ctl.alert(
                f"{self.name}: the hung executor on {host} was not killed cleanly: {result.why}",
                job=self.name,
                host=host,
            )

    async def _exit_from_workdir(self: JobSupervisor, host: str) -> Outcome:
        """The executor is gone: how did it end? Its events.jsonl says."""
        t = self.ctl.fleet.hosts[host].transport
        path = posixpath.join(job_dir(self.ctl.inv.host_root(host), self.name), "events.jsonl")
        try:
            st = await t.stat(path)
            chunks = [
                c
                async for c in t.read_chunks(
                    path, offset=max(0, (st.size if st else 0) - TAIL_BYTES)
                )
            ]
        except TransportError:
            return Outcome(Exit.CRASHED, "the executor is gone and its events cannot be read")
        return from_events_tail(b"".join(chunks).decode(errors="replace"))
