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
import time
from collections import deque
from typing import TYPE_CHECKING

from console.fleet.detect import ClockPace, is_suspect, renew_every
from console.fleet.link import ExecutorLink, LinkError
from console.jobs.launcher import START_TIMEOUT_S, Launcher
from console.jobs.lease import JobLease
from console.jobs.observe import Observe
from console.jobs.outcome import Exit, Outcome
from console.jobs.placement import choose_primary, choose_spares
from console.jobs.recovery import Recovery
from console.jobs.standby import Prepared, Standby
from console.jobs.watch import POLL_S, Watch
from console.reach.deploy import job_dir
from console.reach.transport.base import TransportError
from console.records.journal import Kind
from console.states import JOB_TRANSITIONS, FailureKind, JobState, Machine
from protocol.messages import Stop
from protocol.spec import CheckpointManifest

if TYPE_CHECKING:
    from console.jobs.controller import Controller

HISTORY_LEN = 600
"""Progress samples kept for the console's curves (one per Progress message)."""
LOG_TAIL_LEN = 200
CHECKPOINTS_KEPT = 12


class JobSupervisor(Watch, Standby, Recovery, Observe):
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
        self.history: deque[tuple[float, int, float, float]] = deque(maxlen=HISTORY_LEN)
        """(time, step, loss, steps/s) per Progress message, oldest first."""
        self.checkpoints: deque[tuple[str, CheckpointManifest]] = deque(maxlen=CHECKPOINTS_KEPT)
        """(host written on, manifest) of the newest checkpoints, oldest first."""
        self.log_tail: deque[str] = deque(maxlen=LOG_TAIL_LEN)
        """The executor's Log and Fault lines, newest last."""
        self.last_seen = 0.0
        c = ctl.inv.console
        self.lease = JobLease(self.rec, ctl.store.save, ttl_s=c.lease_s, skew_s=c.clock_skew_s)
        self.pace = ClockPace(c.lease_s)
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
        self.stop_requested = False
        """An operator asked this job to stop (remembered across consoles once it has)."""
        self.launcher = Launcher(
            name,
            inv=ctl.inv,
            transport=lambda h: ctl.fleet.hosts[h].transport,
            journal=ctl.journal,
            phase=self._phase,
            console_id=ctl.console_id,
            executor_env=ctl.executor_env,
            ended=self._exit_from_workdir,
        )
        self.dismissed = self.launcher.dismissed
        """(host, pid) of executors told they are not needed (see Launcher.dismissed)."""
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
        if self.ctl.read_only:
            await self._observe()
            return
        if self.rec.finished_sha256:
            self.step = self.rec.finished_step or self.spec.steps
            self._set(JobState.RUNNING, "finished before this console started")
            self._set(JobState.FINISHED)
            return
        if self.rec.stopped:
            self.failure = FailureKind.STOPPED
            self._set(JobState.FAILED, "stopped by an operator before this console started")
            return
        nxt = await self._first_launch()
        while not self.state.is_terminal():
            if isinstance(nxt, tuple) and self._stop_before_start():
                return
            outcome = await self._launch(*nxt) if isinstance(nxt, tuple) else nxt
            if outcome is None:
                outcome = await self._watch()
            nxt = await self._recover(outcome)

    async def _first_launch(self) -> tuple[str, bool] | Outcome | None:
        """Reattach to a live executor from an earlier console, or say where to start.

        A job's host that cannot be reached is not taken for one whose executor is gone: the
        executor may still be training under the lease the console before this one granted,
        so it is treated as a link lost under that lease (persisted, and waited out).
        """
        host = self.rec.host
        if host and host in self.ctl.fleet.hosts:
            self.host = host
            self.ctl.fleet.hosts[host].job = self.name
            self.lease.restore()
            link = ExecutorLink(
                self.ctl.fleet.hosts[host].transport, self._socket(host), self.ctl.console_id
            )
            try:  # short: an unreachable host is waited out below, not here
                hello = await link.open(timeout=2)
            except LinkError:
                hello = None
            if hello is not None and hello.epoch == self.epoch and hello.state == "training":
                self.link, self.step = link, hello.step
                self.last_seen = time.monotonic()
                with contextlib.suppress(LinkError):
                    await link.send(self.lease.renewal(link, host, self.epoch))
                self._note_reattached(host)
                return None
            if hello is None and self.epoch > 0 and await self._wait_gone(host, 2.0) is not True:
                link.close()
                self.last_seen = time.monotonic()
                self._set(
                    JobState.PENDING,
                    f"{host} not reachable at console start: waiting out its lease "
                    f"({max(0.0, self.lease.left()):.0f} s left at most)",
                )
                outcome = await self._after_link_loss("not reachable at console start")
                if outcome is None:
                    self._note_reattached(host)
                return outcome
            if hello is not None:
                await self._retire(link, host)
            link.close()
            return host, False
        return await self._place()

    def _note_reattached(self, host: str) -> None:
        hello = self.link.hello if self.link is not None else None
        if self.incident is not None and hello is not None:  # a console restart: nothing lost
            self.resumed_step = hello.step
            self._phase("loaded", step=hello.step)
        self.ctl.journal.record(
            Kind.EXECUTOR,
            f"{self.name}: reattached to executor pid {hello.pid if hello else '?'} on {host}",
            job=self.name,
            host=host,
            data={"pid": hello.pid if hello else None, "epoch": self.epoch},
        )
        self._set(JobState.RUNNING, "reattached")

    async def _retire(self, link: ExecutorLink, host: str) -> None:
        """An executor this console cannot adopt (idle, or of another epoch): stop it, wait for its lock."""
        if link.hello is not None:
            self.dismissed.add((host, link.hello.pid))
        with contextlib.suppress(LinkError):
            await link.send(Stop(reason="not adopted by the console", checkpoint=False))
        await self._wait_gone(host)

    async def _wait_gone(self, host: str, probe_s: float = 3.0) -> bool | None:
        """Until no executor holds this job's lock on ``host`` (one may still be exiting).

        True once seen gone; False if one still held it at the deadline; None if the host
        could not be asked (unreachable is not gone).
        """
        workdir = job_dir(self.ctl.inv.host_root(host), self.name)
        deadline = time.monotonic() + START_TIMEOUT_S / 6
        while time.monotonic() < deadline:
            alive = await self._probe_alive(host, workdir, probe_s)
            if alive is None:
                return None
            if alive is False:
                return True
            await asyncio.sleep(POLL_S)
        return False

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
            if host is not None or self.stop_requested:
                return host, False  # a stop is honoured before the launch
            self._wait_note(f"no usable host for {self.name}")
            await ctl.wait_for_hosts()

    def _stop_before_start(self) -> bool:
        """An operator's stop that found no executor to tell is honoured here, before any start."""
        if not self.stop_requested:
            return False
        self.rec.stopped = True
        self.ctl.store.save()
        self._fail(FailureKind.STOPPED, "stopped by an operator")
        self._release()
        return True

    def _wait_note(self, why: str) -> None:
        if self.state is not JobState.PENDING:
            self._set(JobState.PENDING, why)
        if self.why != why or not self.ctl.alerted(why):
            self.ctl.alert(why, job=self.name)

    # --------------------------------------------------------------- launch

    def _socket(self, host: str) -> str:
        return self.launcher.socket(host)

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
        self.pace = ClockPace(ctl.inv.console.lease_s)  # another executor, another clock
        self.last_seen = time.monotonic()
        try:
            await link.send(self.lease.start(link, host, self.spec, self.epoch))
        except LinkError as e:
            return Outcome(Exit.CRASHED, f"executor on {host} went away before Start: {e}")
        self._set(JobState.RUNNING, f"on {host}, epoch {self.epoch}")
        if ctl.inv.jobs[self.name].placement.warm_standby:
            self._standby_task = asyncio.create_task(
                self._keep_standby(), name=f"{self.name} standby"
            )
        return None

    async def _start_executor(self, host: str, promote_replica: bool) -> ExecutorLink | Outcome:
        """An idle executor on ``host``, linked and pumped; or why not."""
        started = await self.launcher.start(
            host, promote_upto=self.epoch if promote_replica else None, released=self._freed
        )
        if isinstance(started, ExecutorLink):
            self._pump(started)
        return started

    async def _promote(self, host: str) -> None:
        await self.launcher.promote(host, self.epoch)

    def _freed(self, host: str) -> None:
        """A host readied for this job and then not used is free for others again."""
        rt = self.ctl.fleet.hosts[host]
        if rt.job == self.name and host != self.host:
            rt.job = None
        self.ctl.fleet.changed.set()

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
        while True:
            await asyncio.sleep(renew_every(self.ctl.detection))
            link, host = self.link, self.host
            if link is None or link.hello is None or host is None:
                continue
            with contextlib.suppress(LinkError):
                await link.send(self.lease.renewal(link, host, self.epoch))

    async def _liveness(self) -> None:
        """A hung executor keeps its connection but stops heartbeating: close the link to react."""
        while True:
            await asyncio.sleep(POLL_S)
            if self.link is not None and is_suspect(
                time.monotonic(), self.last_seen, self.ctl.detection
            ):
                self.link.close()
