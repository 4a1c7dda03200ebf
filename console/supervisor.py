"""One job's life: launch on a host, watch it, and recover by restart or failover.

Example sequences (as in the journal):

- ``A running -> executor SIGKILL -> restart on A (epoch 2) -> running``
- ``A running -> A unreachable -> suspect -> lease ended -> failover to B (epoch 3) -> running``
- ``A running -> drain A -> checkpoint now -> replicate -> B (0 lost steps)``
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import posixpath
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from console.deploy import deploy, executor_command, job_dir, replica_dir
from console.detect import is_suspect, lease_end, renew_every
from console.journal import Kind
from console.link import ExecutorLink, LinkError
from console.outcome import Exit, Outcome, from_events_tail, from_stopped
from console.placement import choose_primary, choose_spares
from console.policy import Decision, decide
from console.recovery import Recovery
from console.remote import executor_alive, list_manifests, promote
from console.replicator import Source
from console.states import JOB_TRANSITIONS, FailureKind, HostState, JobState, Machine
from console.transport.base import TransportError
from protocol.messages import (
    CheckpointSaved,
    ExecutorMessage,
    Fault,
    Finished,
    Health,
    Heartbeat,
    Lease,
    Progress,
    Resumed,
    Start,
    Stop,
    Stopped,
)
from protocol.spec import CheckpointManifest

if TYPE_CHECKING:
    from console.controller import Controller

START_TIMEOUT_S = 90.0
POLL_S = 0.2
TAIL_BYTES = 64 * 1024


@dataclass
class Prepared:
    """An idle executor on a host other than the job's, ready to be told Start."""

    host: str
    link: ExecutorLink
    promoted: bool = False
    """The newest replica is already in place as its checkpoint."""


class JobSupervisor(Recovery):
    def __init__(self, ctl: Controller, name: str) -> None:
        self.ctl = ctl
        self.name = name
        self.spec = ctl.inv.jobs[name].spec
        self.rec = ctl.store.job(name)
        self.machine: Machine[JobState] = Machine(JobState.PENDING, JOB_TRANSITIONS)
        self.failure: FailureKind | None = None
        self.host: str | None = None
        self.spares: list[str] = list(self.rec.spares)
        self.link: ExecutorLink | None = None
        self.step = 0
        self.loss = math.nan
        self.steps_per_s = 0.0
        self.checkpoint: CheckpointManifest | None = None
        self.checkpoint_path: str | None = None
        self.last_seen = 0.0
        self.last_lease_sent = 0.0
        self.exit: Outcome | None = None
        self.incident: int | None = None
        self.resumed_step: int | None = None
        self.sha256: str | None = self.rec.finished_sha256
        self.why = ""
        self.approval: asyncio.Future[bool] | None = None
        self.target: str | None = None
        """An operator's chosen failover host."""
        self.prepared: Prepared | None = None
        """An idle executor readied on the failover target while the old lease runs out."""
        self._preparing: asyncio.Task[Prepared | None] | None = None
        self.standby: Prepared | None = None
        """The warm standby on the first spare, when the job asks for one."""
        self._standby_task: asyncio.Task[None] | None = None
        self._pumps: dict[int, asyncio.Task[str]] = {}
        self.early_phases: list[tuple[str, float, dict[str, object]]] = []
        self._warned = 0

    # ---------------------------------------------------------------- state

    @property
    def state(self) -> JobState:
        return self.machine.state

    @property
    def epoch(self) -> int:
        return self.rec.epoch

    def _set(self, state: JobState, why: str = "") -> None:
        before = self.state
        if self.machine.move(state):
            self.why = why
            self.ctl.journal.record(
                Kind.JOB_STATE,
                f"{self.name}: {before.value} -> {state.value}" + (f" ({why})" if why else ""),
                job=self.name,
                host=self.host,
                data={"from": before.value, "to": state.value, "why": why, "epoch": self.epoch},
            )

    def _fail(self, kind: FailureKind, why: str) -> None:
        self.failure = kind
        self._set(JobState.FAILED, f"{kind.value}: {why}")
        self.ctl.alert(f"job {self.name} failed ({kind.value}): {why}", job=self.name)

    # ------------------------------------------------------------------ run

    async def run(self) -> None:
        if self.rec.finished_sha256:
            self.step = self.rec.finished_step or self.spec.steps
            self._set(JobState.RUNNING, "finished before this console started")
            self._set(JobState.FINISHED)
            return
        launch = await self._first_launch()
        while not self.state.is_terminal():
            if launch is not None:
                host, promote_replica = launch
                outcome = await self._launch(host, promote_replica)
            else:
                outcome = None
            if outcome is None:
                outcome = await self._watch()
            launch = await self._recover(outcome)

    async def _first_launch(self) -> tuple[str, bool] | None:
        """Reattach to a live executor from an earlier console, or say where to start."""
        host = self.rec.host
        if host and host in self.ctl.fleet.hosts:
            self.host = host
            self.ctl.fleet.hosts[host].job = self.name
            link = ExecutorLink(
                self.ctl.fleet.hosts[host].transport, self._socket(host), self.ctl.console_id
            )
            try:
                hello = await link.open(timeout=5)
            except LinkError:
                hello = None
            if (
                hello is not None
                and hello.epoch == self.epoch
                and hello.state in ("training", "idle")
            ):
                self.link, self.step = link, hello.step
                self.last_seen = time.monotonic()
                self.last_lease_sent = time.time()
                await link.send(
                    Lease(
                        epoch=self.epoch,
                        ttl_s=self.ctl.inv.console.lease_s,
                        sent_at=self.last_lease_sent,
                    )
                )
                self.ctl.journal.record(
                    Kind.EXECUTOR,
                    f"{self.name}: reattached to executor pid {hello.pid} on {host}",
                    job=self.name,
                    host=host,
                    data={"pid": hello.pid, "epoch": hello.epoch},
                )
                self._set(JobState.RUNNING, "reattached")
                return None
            link.close()
            return host, False
        return await self._place()

    async def _place(self) -> tuple[str, bool] | None:
        while True:
            ctl = self.ctl
            host = choose_primary(
                ctl.inv,
                self.name,
                usable=ctl.fleet.usable(),
                reserved=ctl.reserved(self.name),
                priority=ctl.priorities(),
            )
            if host is not None:
                return host, False
            self._wait_note(f"no usable host for {self.name}")
            await ctl.wait_for_hosts()

    def _wait_note(self, why: str) -> None:
        if self.state is not JobState.PENDING:
            self._set(JobState.PENDING, why)
        if self.why != why or not self.ctl.alerted(why):
            self.ctl.alert(why, job=self.name)

    # --------------------------------------------------------------- launch

    def _socket(self, host: str) -> str:
        return posixpath.join(job_dir(self.ctl.inv.host_root(host), self.name), "executor.sock")

    def _assign(self, host: str) -> None:
        fleet = self.ctl.fleet
        if self.host and self.host != host and fleet.hosts[self.host].job == self.name:
            fleet.hosts[self.host].job = None
        self.host = host
        fleet.hosts[host].job = self.name
        choice = choose_spares(
            self.ctl.inv,
            self.name,
            host,
            usable=fleet.usable(),
            reserved=self.ctl.reserved(self.name),
            priority=self.ctl.priorities(),
            count=max(1, len(self.ctl.inv.jobs[self.name].placement.spares)),
        )
        for spare, other in choice.taken:
            self.ctl.take_spare(spare, other, by=self.name)
        self.spares = choice.spares
        self.rec.host, self.rec.spares = host, list(choice.spares)
        self.ctl.store.save()
        self.ctl.journal.record(
            Kind.PLACEMENT,
            f"{self.name}: on {host}, spares {', '.join(self.spares) or 'none'}",
            job=self.name,
            host=host,
            data={"spares": self.spares},
        )
        if not self.spares:
            self.ctl.alert(
                f"job {self.name} has no spare: a host failure will wait for one", job=self.name
            )

    async def _launch(self, host: str, promote_replica: bool) -> Outcome | None:
        """Deploy, start and link an executor on ``host`` (unless one was prepared there), then Start it."""
        ctl = self.ctl
        self._set(JobState.DEPLOYING, f"on {host}")
        self._assign(host)
        prepared, self.prepared = self.prepared, None
        if prepared is not None and prepared.host == host and self._pumping(prepared.link):
            link = prepared.link
            if promote_replica and not prepared.promoted:
                try:
                    await self._promote(host)
                except TransportError as e:
                    return Outcome(Exit.HOST_LOST, f"cannot promote the replica on {host}: {e}")
        else:
            if prepared is not None:
                await self._discard(prepared)
            started = await self._start_executor(host, promote_replica)
            if isinstance(started, Outcome):
                return started
            link = started
        self.rec.epoch += 1
        ctl.store.save()
        self.link = link
        self.last_seen = time.monotonic()
        self.last_lease_sent = time.time()
        try:
            await link.send(
                Start(
                    spec=self.spec,
                    epoch=self.epoch,
                    lease_s=ctl.inv.console.lease_s,
                    lease_sent_at=self.last_lease_sent,
                )
            )
        except LinkError as e:
            return Outcome(Exit.CRASHED, f"executor on {host} went away before Start: {e}")
        self._set(JobState.RUNNING, f"on {host}, epoch {self.epoch}")
        if ctl.inv.jobs[self.name].placement.warm_standby:
            self._standby_task = asyncio.create_task(
                self._keep_standby(), name=f"{self.name} standby"
            )
        return None

    async def _start_executor(self, host: str, promote_replica: bool) -> ExecutorLink | Outcome:
        """An idle executor on ``host`` (torch imported, waiting for Start), linked; or why not."""
        ctl = self.ctl
        t = ctl.fleet.hosts[host].transport
        root, python = ctl.inv.host_root(host), ctl.inv.python(host)
        workdir = job_dir(root, self.name)
        try:
            await t.connect()
            bundle = await deploy(t, root, python)
            await t.makedirs(workdir)
            if promote_replica:
                await self._promote(host)
            hb = str(ctl.inv.console.heartbeat_s)
            argv, env = executor_command(
                python,
                bundle.path,
                ["serve", "--workdir", workdir, "--heartbeat-s", hb, "--health-s", hb],
            )
            env.update(ctl.executor_env.get(host, {}))
            pid = await t.start_detached(
                argv, log_path=posixpath.join(workdir, "executor.log"), env=env, cwd=workdir
            )
        except TransportError as e:
            return Outcome(Exit.HOST_LOST, f"cannot start on {host}: {e}")
        ctl.journal.record(
            Kind.EXECUTOR,
            f"{self.name}: executor pid {pid} started on {host}",
            job=self.name,
            host=host,
            data={"pid": pid, "epoch": self.epoch + 1},
        )
        link = ExecutorLink(t, self._socket(host), ctl.console_id)
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                hello = await link.open(timeout=5)
                break
            except LinkError as e:
                if time.monotonic() > deadline:
                    return Outcome(
                        Exit.CRASHED, f"executor did not answer within {START_TIMEOUT_S:g}s: {e}"
                    )
                if not await self._pid_alive(host, pid):
                    return await self._exit_from_workdir(host)
                await asyncio.sleep(POLL_S)
        self._phase("executor_up", pid=hello.pid, host=host)
        self._pump(link)
        return link

    async def _promote(self, host: str) -> None:
        """Put the newest replica on ``host`` in place as the executor's only checkpoint."""
        ctl = self.ctl
        t = ctl.fleet.hosts[host].transport
        root, python = ctl.inv.host_root(host), ctl.inv.python(host)
        checkpoints = posixpath.join(job_dir(root, self.name), "checkpoints")
        replicas = [
            m
            for m in await list_manifests(t, python, replica_dir(root, self.name))
            if m.epoch <= self.epoch
        ]
        if replicas:
            await promote(t, python, replica_dir(root, self.name), checkpoints, replicas[-1].step)
        else:
            await t.remove(checkpoints)
        step = replicas[-1].step if replicas else 0
        self._phase("transfer_done", host=host, replica_step=step)

    # ---------------------------------------------------------------- watch

    async def _watch(self) -> Outcome:
        self.exit = None
        tasks = [asyncio.create_task(self._renew_leases()), asyncio.create_task(self._liveness())]
        try:
            while True:
                assert self.link is not None
                why = await self._pump(self.link)
                if self.exit is not None:
                    return self.exit
                outcome = await self._after_link_loss(why)
                if outcome is not None:
                    return outcome
        finally:
            for task in tasks:
                task.cancel()
            self.link = None

    async def _renew_leases(self) -> None:
        settings = self.ctl.inv.console
        while True:
            await asyncio.sleep(renew_every(self.ctl.detection))
            link = self.link
            if link is None or link.hello is None:
                continue
            sent_at = time.time()
            with contextlib.suppress(LinkError):
                await link.send(Lease(epoch=self.epoch, ttl_s=settings.lease_s, sent_at=sent_at))
                self.last_lease_sent = sent_at

    async def _liveness(self) -> None:
        """A hung executor keeps its connection but stops heartbeating: close the link to react."""
        while True:
            await asyncio.sleep(POLL_S)
            if self.link is not None and is_suspect(
                time.monotonic(), self.last_seen, self.ctl.detection
            ):
                self.link.close()

    def _on_message(self, msg: ExecutorMessage) -> None:
        assert self.host is not None
        if isinstance(msg, Heartbeat):
            self.last_seen = time.monotonic()
            self.ctl.fleet.seen(self.host)
        elif isinstance(msg, Progress):
            self.last_seen = time.monotonic()
            self.step, self.loss, self.steps_per_s = msg.step, msg.loss, msg.steps_per_s
            if (
                self.incident is not None
                and self.resumed_step is not None
                and msg.step > self.resumed_step
            ):
                self._phase("first_step", step=msg.step)
                self.incident = None
            self.ctl.on_progress(self, msg)
        elif isinstance(msg, CheckpointSaved):
            self.checkpoint, self.checkpoint_path = msg.manifest, msg.path
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
                    self.name, self.spares, Source(self.host, msg.path, msg.manifest)
                )
        elif isinstance(msg, Resumed):
            self.resumed_step = msg.step
            self._phase("loaded", step=msg.step, load_s=msg.load_s, checkpoint=msg.checkpoint)
        elif isinstance(msg, Health):
            self._on_health(msg)
        elif isinstance(msg, Fault):
            self._on_fault(msg)
        elif isinstance(msg, Finished):
            self.exit = Outcome(Exit.FINISHED, "finished", msg.step, sha256=msg.params_sha256)
        elif isinstance(msg, Stopped):
            self.exit = from_stopped(msg.reason, msg.step, msg.checkpoint_step)

    def _on_fault(self, msg: Fault) -> None:
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
        if msg.fault == "config":
            self.exit = Outcome(Exit.CONFIG, msg.message)

    def _on_health(self, msg: Health) -> None:
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

    async def _after_link_loss(self, why: str) -> Outcome | None:
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
            end = lease_end(self.last_lease_sent, self.ctl.detection)
            if probed and silent and time.time() >= end:
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
            budget = max(0.2, min(probe_s, end - time.time())) if silent else probe_s
            if await self._relink(host, budget):
                await self._cancel_preparation()
                return None
            alive = await self._probe_alive(host, workdir, budget)
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

    async def _relink(self, host: str, budget: float) -> bool:
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
            return True
        link.close()
        return False

    async def _probe_alive(self, host: str, workdir: str, budget: float) -> bool | None:
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

    async def _kill(self, host: str, workdir: str) -> None:
        t = self.ctl.fleet.hosts[host].transport
        with contextlib.suppress(TransportError):
            await t.run(["pkill", "-KILL", "-f", f"--workdir {workdir}"], timeout=10)

    async def _exit_from_workdir(self, host: str) -> Outcome:
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

    # ------------------------------------------------------------ preparation

    async def _prepare_failover(self, old: str) -> Prepared | None:
        """While the lost host's lease runs out: replica in place and an idle executor up on the target.

        Nothing trains until Start, which is sent only after the lease has ended.
        """
        standby = self.standby
        if standby is not None and standby.host != old and self._pumping(standby.link):
            try:
                await self._ensure_replica(standby.host)
                await self._promote(standby.host)
            except TransportError:
                return None
            self.standby = None
            return Prepared(standby.host, standby.link, promoted=True)
        target = await self._pick_target(old)
        if target is None:
            return None
        fleet = self.ctl.fleet
        fleet.hosts[target].job = self.name
        try:
            await self._ensure_replica(target)
            started = await self._start_executor(target, promote_replica=True)
        except TransportError:
            started = None
        if isinstance(started, ExecutorLink):
            return Prepared(target, started, promoted=True)
        if fleet.hosts[target].job == self.name:
            fleet.hosts[target].job = None
        return None

    async def _cancel_preparation(self) -> None:
        self.early_phases = []
        task, self._preparing = self._preparing, None
        if task is None:
            return
        task.cancel()
        result = await asyncio.gather(task, return_exceptions=True)
        if isinstance(result[0], Prepared):
            await self._discard(result[0])

    async def _discard(self, prepared: Prepared) -> None:
        with contextlib.suppress(LinkError):
            await prepared.link.send(Stop(reason="not needed", checkpoint=False))
        prepared.link.close()
        rt = self.ctl.fleet.hosts[prepared.host]
        if rt.job == self.name and prepared.host != self.host:
            rt.job = None

    # ------------------------------------------------------------------ pumps

    def _pump(self, link: ExecutorLink) -> asyncio.Task[str]:
        """One reader per link for its whole life, so a standby's link can become the job's link."""
        task = self._pumps.get(id(link))
        if task is None:
            task = asyncio.create_task(link.pump(lambda msg: self._route(link, msg)))
            self._pumps[id(link)] = task
            task.add_done_callback(lambda _t: None)
        return task

    def _pumping(self, link: ExecutorLink) -> bool:
        task = self._pumps.get(id(link))
        return link.hello is not None and task is not None and not task.done()

    def _route(self, link: ExecutorLink, msg: ExecutorMessage) -> None:
        if link is self.link:
            self._on_message(msg)
            return
        host = link.transport.name
        if isinstance(msg, Heartbeat):
            self.ctl.fleet.seen(host)
        elif isinstance(msg, Health):
            self.ctl.fleet.observe(host, msg)

    # ------------------------------------------------------------ warm standby

    async def _keep_standby(self) -> None:
        """An idle executor on the first live spare: torch imported and warmed up, waiting for Start."""
        fleet = self.ctl.fleet
        spare = next((s for s in self.spares if fleet.hosts[s].state is HostState.UP), None)
        current = self.standby
        if current is not None and current.host == spare and self._pumping(current.link):
            return
        if current is not None:
            self.standby = None
            await self._discard(current)
        if spare is None:
            return
        fleet.hosts[spare].job = self.name
        started = await self._start_executor(spare, promote_replica=False)
        if isinstance(started, ExecutorLink):
            self.standby = Prepared(spare, started)
            self.ctl.journal.record(
                Kind.EXECUTOR,
                f"{self.name}: warm standby ready on {spare}",
                job=self.name,
                host=spare,
                data={"standby": True},
            )
        elif fleet.hosts[spare].job == self.name:
            fleet.hosts[spare].job = None

    async def _drop_standby(self) -> None:
        task, self._standby_task = self._standby_task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        standby, self.standby = self.standby, None
        if standby is not None:
            await self._discard(standby)
