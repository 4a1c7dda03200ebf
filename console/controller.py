"""The fleet controller: one asyncio program that both the TUI and the headless runner drive.

It owns the inventory, the journal, the operator state, the fleet and one supervisor per
job. Everything an operator can do by key is a method here, and a policy calls the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from console.export.tensorboard import ExportError, TensorBoardExport, open_tensorboard
from console.fleet.detect import DetectionSettings
from console.fleet.hosts import Fleet
from console.fleet.monitor import HostMonitor
from console.inventory import Inventory, append_host
from console.reach.transport.local import LocalTransport
from console.records.console_lock import ConsoleLock
from console.records.incidents import IncidentLog, Resolution, unclean_exit
from console.records.journal import TAIL_BYTES, Journal, Kind, is_longer_than, read
from console.records.state_store import StateStore
from console.records.timeline import Timeline
from console.replication.replicator import Replicator
from console.spares.host_supply import HostSupply
from console.spares.spare_keeper import REPLACED_WITHIN_S
from console.states import HOST_ORDERS, HostState, JobState, host_order_refusal
from console.supervise.incident import carry_on
from console.supervise.observe import FOLLOW_EVERY_S
from console.supervise.orders import ON_ITS_WAY
from console.supervise.policy import Policy
from console.supervise.refusal import Refused
from console.supervise.restart import paid_off
from console.supervise.services import JobServices
from console.supervise.supervisor import Supervisor
from console.webhook import Webhook
from protocol.faults import StopReason
from protocol.messages import Progress

ALERT_REPEAT_S = 60.0
PROGRESS_JOURNAL_EVERY_S = 10.0
METRICS_OPEN_S = 30.0
"""The most the console waits at start to open its metrics export (import, folder check)."""
JOURNAL_FOLLOW_S = 0.25
"""How often a read-only console (a view) reads what the owner appended to the journal."""
STATE_RETRY_S = 1.0
"""How often a state save that failed (a full disk), and journal lines held back, are retried."""


class Controller:
    def __init__(
        self,
        inv: Inventory,
        policy: Policy = Policy.MANUAL,
        *,
        executor_env: dict[str, dict[str, str]] | None = None,
        read_only: bool = False,
        lock: ConsoleLock | None = None,
        term: int = 0,
        took_over: float | None = None,
    ) -> None:
        """``lock``: the state dir's, already held (a standby holds it while it waits);
        ``term``: the leader's (``console/service/leader.py``), said to every executor;
        ``took_over``: wall time from which this leader took over from one that died (its
        jobs get a ``console_failover`` incident each)."""
        self.inv = inv
        self.term = term
        self._took_over = took_over
        self.policy = policy
        self.read_only = read_only
        self.executor_env = executor_env or {}
        """Extra environment for executors per host: test hooks (fake NVML, fault injection)."""
        self.console_id = f"{socket.gethostname()}:{os.getpid()}"
        self.lock = lock or ConsoleLock(inv.state_dir)
        """Held for this console's life; a read-only console watches and takes none."""
        if not read_only and lock is None:
            self.lock.acquire()
        self.journal = Journal(inv.state_dir / "journal.jsonl", read_only=read_only)
        self.timeline = Timeline(self.journal)
        self.store = StateStore(inv.state_dir, read_only=read_only)
        self.fleet = Fleet(inv, self.journal, self.store)
        self.incidents = IncidentLog(self.journal, self.store)
        self.replicator = Replicator(
            inv,
            transport=lambda host: self.fleet.hosts[host].transport,
            journal=self.journal,
            incidents=self.incidents,
            step_of=lambda job: self.jobs[job].step if job in self.jobs else None,
            read_only=read_only,
        )
        c = inv.console
        self.detection = DetectionSettings(
            c.heartbeat_s, c.missed_heartbeats, c.suspect_after_s, c.lease_s, c.clock_skew_s
        )
        self.supply = (
            None
            if inv.provisioner is None or read_only
            else HostSupply(
                inv.provisioner,
                inv=inv,
                fleet=self.fleet,
                store=self.store,
                add_host=self.add_host,
                reserved=lambda: {h for sup in self.jobs.values() for h in sup.spares},
                busy=self._host_busy,
                journal=self.journal,
                alert=self.alert,
            )
        )
        """Hosts provisioned when a job needs one (``[provisioner]``), released when idle."""
        self.services = JobServices(
            inv=inv,
            fleet=self.fleet,
            journal=self.journal,
            store=self.store,
            incidents=self.incidents,
            replicator=self.replicator,
            detection=self.detection,
            read_only=read_only,
            console_id=self.console_id,
            term=term,
            executor_env=self.executor_env,
            policy=lambda: self.policy,
            alert=self.alert,
            alerted=self.alerted,
            reserved=self.reserved,
            priorities=self.priorities,
            take_spare=self.take_spare,
            need_host=self.need_host,
            wait_for_hosts=self.wait_for_hosts,
            on_progress=self.on_progress,
        )
        """What each job's supervisor may use of this controller (``console/supervise/services``)."""
        self.jobs = {name: self._supervisor(name) for name in inv.jobs}
        self.alert_sinks: list[Callable[[str], None]] = []
        self.progress_sinks: list[Callable[[str, Progress], None]] = []
        """Told of every Progress message: (job, message)."""
        self._alerted: dict[str, float] = {}
        self._progress_at: dict[str, float] = {}
        self._job_tasks: dict[str, asyncio.Task[None]] = {}
        self._jobs_changed = asyncio.Event()
        self.monitor = HostMonitor(
            self.fleet,
            inv,
            self.journal,
            alert=self.alert,
            spares=lambda: {
                name: list(sup.spares)
                for name, sup in self.jobs.items()
                if not sup.state.is_terminal()
            },
            executor_env=self.executor_env,
            may_deploy=not read_only,
            need_host=self.need_host,
            replaced_within_s=REPLACED_WITHIN_S,
        )
        """Up or down, and fit or not, for every host no job runs on."""
        self._state_alert: str | None = None
        self.store.on_trouble(self._state_trouble)

    # ------------------------------------------------------------------ run

    async def run(self, *, stay: bool = False) -> dict[str, JobState]:
        """Supervise every job until each is finished or failed; returns their final states.

        With ``stay`` (an operator's console) it keeps watching the hosts and serving actions
        (a job started again, a host added) after the last job ends, until cancelled.
        """
        path = self.journal.path
        died = unclean_exit(
            read(path, tail_bytes=TAIL_BYTES), whole=not is_longer_than(path, TAIL_BYTES)
        )
        self.journal.record(
            Kind.CONSOLE,
            f"console started (policy {self.policy.value})",
            data={"pid": os.getpid(), "policy": self.policy.value, "inventory": str(self.inv.path)},
        )
        metrics = await self._open_metrics()
        if self._took_over is not None:
            self._console_died(self._took_over, {}, "console_failover")
        elif died is not None and not self.read_only:
            self._console_died(*died)
        background = [asyncio.create_task(self.monitor.run(), name="host monitor")]
        if self.supply is not None:
            keep = self.supply.keep(self.monitor.settle)
            background.append(asyncio.create_task(keep, name="provisioned hosts"))
        if self.read_only:
            background.append(asyncio.create_task(self._follow_state(), name="follow state"))
        else:
            background.append(asyncio.create_task(self._keep_state(), name="state retry"))
        if self.inv.console.webhook:
            hook = Webhook(
                self.inv.console.webhook, on_failure=lambda m: self.journal.record(Kind.ALERT, m)
            )
            self.alert_sinks.append(hook.send)
            background.append(asyncio.create_task(hook.run(), name="webhook"))
        if metrics is not None:
            background.append(asyncio.create_task(metrics.run(), name="metrics export"))
        try:
            for name in self.jobs:
                self._spawn(name)
            await self._supervise(stay)
            # the last checkpoints reach the spares that answer
            await self.replicator.settle(unreachable=self._silent_host)
            if self.inv.console.webhook:
                with contextlib.suppress(TimeoutError):
                    await hook.drain(10)
        finally:
            tasks = [*background, *self._job_tasks.values()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if metrics is not None:
                await metrics.close()
        return {name: sup.state for name, sup in self.jobs.items()}

    async def _open_metrics(self) -> TensorBoardExport | None:
        """The TensorBoard export (``tensorboard_dir``), told of every Progress message and
        journal event; one that cannot be opened is one alert, and the console goes on."""
        root = self.inv.tensorboard_dir
        if root is None or self.read_only:
            return None
        try:
            async with asyncio.timeout(METRICS_OPEN_S):
                metrics = await asyncio.to_thread(open_tensorboard, root, self.alert)
        except ExportError as e:
            self.alert(str(e))
            return None
        except TimeoutError:
            self.alert(f"tensorboard_dir {root}: not opened in {METRICS_OPEN_S:g} s; no metrics")
            return None
        self.progress_sinks.append(metrics.progress)
        self.journal.subscribe(metrics.event)
        return metrics

    def _supervisor(self, name: str) -> Supervisor:
        """Every job's: one on one host is a group of one (issue 30: one supervisor)."""
        return Supervisor(self.services, name)

    def _console_died(
        self, at: float, steps: dict[str, int], fault_class: str = "console_restart"
    ) -> None:
        """The console before this one was killed (``console_failover``: the leader before
        this one, on another machine): an incident per job it left running, resolved at the
        job's next step under this console (reattached, or restarted).

        A job whose incident was still open when that console died carries on in it (the
        death is recorded as a phase) rather than leaving it open forever. Nothing is counted
        as loaded until this console sees where the job resumes.
        """
        for name, sup in self.jobs.items():
            if sup.rec.finished or sup.rec.stopped or not sup.rec.host:
                continue  # a stopped job was left running by no console
            carried = self._open_incident(name)
            if carried is not None:
                n = carried
                self.incidents.phase(
                    n, name, fault_class, msg=f"incident {n}: {name}: {fault_class}"
                )
            else:
                n = self.incidents.open(
                    name,
                    sup.rec.host,
                    fault_class,
                    fault_at=at,
                    last_step=steps.get(name, 0),
                    msg=(
                        "the leader before this one is gone; this standby took over, reattaching"
                        if fault_class == "console_failover"
                        else "the console before this one died; reattaching"
                    ),
                )
            self.incidents.phase(n, name, "decided", action="reattach")
            sup.incident, sup.resumed_step = n, None

    def _open_incident(self, job: str) -> int | None:
        """The job's newest incident still open when the console before this one ended: as
        this journal has it, or, for one this journal never saw (opened by the leader before
        this standby, on its machine), as the state it left says."""
        known = self.timeline.incidents()
        ids = {i.id for i in known}
        found = [i.id for i in known if i.job == job and i.resolution is Resolution.OPEN]
        found += [n for n in self.store.job(job).open_incidents if n not in ids]
        return max(found, default=None)

    def _spawn(self, name: str) -> None:
        self._job_tasks[name] = asyncio.create_task(self._run_job(name), name=f"job {name}")
        self._jobs_changed.set()

    async def _run_job(self, name: str) -> None:
        """A job's supervisor to its end; then the keys that copied its replicas go."""
        await self.jobs[name].run()
        await self.replicator.job_ended(name)

    async def _supervise(self, stay: bool) -> None:
        """Until every job task is done (or, with ``stay``, forever); a supervisor's bug raises."""
        while True:
            for task in self._job_tasks.values():
                if task.done() and not task.cancelled() and task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
            pending = {t for t in self._job_tasks.values() if not t.done()}
            if not pending and not stay:
                return
            self._jobs_changed.clear()
            changed = asyncio.create_task(self._jobs_changed.wait())
            try:
                await asyncio.wait({*pending, changed}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                changed.cancel()

    def _silent_host(self, host: str) -> bool:
        """A host the monitor reads as not answering (suspect or down)."""
        rt = self.fleet.hosts.get(host)
        return rt is not None and rt.state in (HostState.SUSPECT, HostState.DOWN)

    async def close(self) -> None:
        await self.services.cleanups.settle()  # no executor started for a job left behind
        if self.supply is not None:
            await self.supply.close()
        for sup in self.jobs.values():
            if sup.link is not None:
                sup.link.close()
        await self.replicator.close()
        await self.fleet.close()
        self.journal.record(Kind.CONSOLE, "console stopped")
        self.journal.sync()
        self.journal.close()
        self.lock.release()

    async def _follow_state(self) -> None:
        """A read-only console reads the owner's state file again now and then, and the
        owner's journal as it grows (its views' notifications, incidents and timelines)."""
        reloaded = 0.0
        while True:
            await asyncio.sleep(JOURNAL_FOLLOW_S)
            self.journal.catch_up()
            if time.monotonic() - reloaded >= FOLLOW_EVERY_S:
                reloaded = time.monotonic()
                with contextlib.suppress(RuntimeError):  # caught mid-replace: next time
                    self.store.reload()

    async def _keep_state(self) -> None:
        """A state save that failed (a full disk) is tried again until it works, and journal
        lines held back are written with it; a lease waits for nothing of this (it is granted
        within the bound on disk meanwhile, ``console/supervise/lease.py``)."""
        while True:
            await asyncio.sleep(STATE_RETRY_S)
            if self.store.unsaved is not None:
                self.store.save()
            self.journal.flush()

    def _state_trouble(self, why: str | None) -> None:
        """The state stopped being saved (why) or is saved again (None): one alert, and one
        journal line when it clears, not one per renewal."""
        if why is not None:
            self._state_alert = (
                f"{why}; the console runs on and retries, granting no lease past the bound "
                "on disk (executors stop at their lease end if this lasts)"
            )
            self.alert(self._state_alert)
            return
        if self._state_alert is not None:
            self._alerted.pop(self._state_alert, None)  # a later failure alerts again
            self._state_alert = None
        cleared = f"{self.store.path}: saved again; leases are granted as before"
        self.journal.record(Kind.ACTION, cleared)
        for sink in self.alert_sinks:  # where the alert went, its end goes too
            sink(cleared)

    # -------------------------------------------------------- used by supervisors

    def reserved(self, for_job: str) -> dict[str, str]:
        """Spares held by other live jobs: host -> job."""
        return {
            s: name
            for name, sup in self.jobs.items()
            if name != for_job and not sup.state.is_terminal()
            for s in sup.spares
        }

    def priorities(self) -> dict[str, int]:
        return {name: job.placement.priority for name, job in self.inv.jobs.items()}

    def take_spare(self, host: str, from_job: str, *, by: str) -> None:
        sup = self.jobs[from_job]
        if host in sup.spares:
            sup.spares.remove(host)
            sup.rec.spares = list(sup.spares)
            self.store.save()
        self.journal.record(
            Kind.PLACEMENT,
            f"spare {host} taken from {from_job} by higher-priority {by}",
            host=host,
            job=from_job,
            data={"taken_by": by},
        )
        self.alert(f"spare {host} was taken from {from_job} by {by}", job=from_job)

    def need_host(self, why: str) -> None:
        """A job needs a host (to move to, or as its spare) and none is usable: provision one,
        when the inventory has a provisioner."""
        if self.supply is not None:
            self.supply.need(why)

    def _host_busy(self, host: str) -> bool:
        """A job trains on it or keeps it as a spare."""
        rt = self.fleet.hosts.get(host)
        return (rt is not None and rt.job is not None) or any(
            host in sup.spares or host in sup.hosts_in_use()
            for sup in self.jobs.values()
            if not sup.state.is_terminal()
        )

    async def wait_for_hosts(self, timeout: float = 5.0) -> None:
        """Until the fleet may have a usable host again (or a while has passed: recheck)."""
        self.need_host("a job waits for a host")
        self.fleet.changed.clear()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self.fleet.changed.wait()

    def alert(self, msg: str, *, job: str | None = None, host: str | None = None) -> None:
        now = time.monotonic()
        if now - self._alerted.get(msg, -ALERT_REPEAT_S) < ALERT_REPEAT_S:
            return
        self._alerted[msg] = now
        self.journal.record(Kind.ALERT, msg, job=job, host=host)
        for sink in self.alert_sinks:
            sink(msg)

    def alerted(self, msg: str) -> bool:
        return time.monotonic() - self._alerted.get(msg, -ALERT_REPEAT_S) < ALERT_REPEAT_S

    def on_progress(self, sup: Supervisor, msg: Progress) -> None:
        for sink in self.progress_sinks:
            sink(sup.name, msg)
        now = time.monotonic()
        if (
            now - self._progress_at.get(sup.name, 0.0) >= PROGRESS_JOURNAL_EVERY_S
            or msg.step == msg.steps
        ):
            self._progress_at[sup.name] = now
            self.journal.record(
                Kind.PROGRESS,
                f"{sup.name}: step {msg.step}/{msg.steps} loss {msg.loss:.4f}",
                job=sup.name,
                host=sup.host,
                data={
                    "step": msg.step,
                    "loss": msg.loss,
                    "steps_per_s": msg.steps_per_s,
                    "global_batch": msg.global_batch,
                    "world_size": msg.world_size,
                },
            )

    def status(self) -> dict[str, dict[str, Any]]:
        """Each job as this controller has it now, for views in other processes: its state
        and why, whether a failover waits for an operator, and where it runs; and the job
        each host holds (a standby's included)."""
        jobs = {
            name: {
                "state": sup.state.value,
                "why": sup.why,
                "awaiting": sup.awaiting_approval,
                "hosts": sup.hosts_in_use(),
                "epoch": sup.epoch,
                "step": sup.step,
            }
            for name, sup in self.jobs.items()
        }
        held = {h: rt.job for h, rt in self.fleet.hosts.items() if rt.job is not None}
        return {"jobs": jobs, "host_jobs": held}

    # --------------------------------------------------------------- actions

    def _act(self, what: str, **fields: Any) -> None:
        if self.read_only:
            raise PermissionError("the console is read-only")
        self.journal.record(Kind.ACTION, what, **fields)

    def _refuse(self, what: str, why: str, **fields: Any) -> NoReturn:
        """An action that would change nothing, or may not be done now: journalled as refused."""
        if self.read_only:
            raise PermissionError("the console is read-only")
        self.journal.record(
            Kind.ACTION, f"{what}: refused ({why})", data={"refused": why}, **fields
        )
        raise Refused(why)

    def _live_job(self, what: str, job: str) -> None:
        """Refuse an order to a job that has ended (finished, failed or stopped)."""
        state = self.jobs[job].state
        if state.is_terminal():
            self._refuse(what, f"{job} is {state.value}", job=job)

    def _host_order(self, order: str, host: str) -> None:
        """Journal an operator's drain, cordon or their undoing, or refuse it where it would
        change nothing (``HOST_ORDERS``)."""
        rt, what = self.fleet.hosts[host], f"{order} {host}"
        why = host_order_refusal(host, rt.state, order)
        if why is None and rt.leaving and HOST_ORDERS[order].to is HostState.UP:
            why = f"{host} is being released (provisioned, idle)"
        if why is not None:
            self._refuse(what, why, host=host)
        self._act(what, host=host)

    def fail_over(self, job: str, target: str | None = None) -> None:
        """Move a job now (to ``target`` or the best spare); approves a pending failover too.
        A multi-host job's move is refused (only its pending failover is approved): a group's
        Drain stops every member at a step and, every host still fit, its next epoch started
        on the same hosts, so the order did nothing it said. A member's host is drained."""
        what = f"fail over {job}" + (f" to {target}" if target else "")
        self._live_job(what, job)
        sup = self.jobs[job]
        if self.inv.multi_host(job) and not sup.awaiting_approval:
            self._refuse(
                what,
                f"{job} trains on several hosts: drain the host of the member to move",
                job=job,
            )
        self._act(what, job=job)
        if not sup.answer(True, target):
            sup.request_move(StopReason.MIGRATE, f"operator: fail over {job}", target, off=sup.host)

    def approve(self, job: str) -> bool:
        self._answer(f"approve recovery of {job}", job)
        return self.jobs[job].answer(True)

    def deny(self, job: str) -> bool:
        self._answer(f"deny recovery of {job}", job)
        return self.jobs[job].answer(False)

    def _answer(self, what: str, job: str) -> None:
        approval = self.jobs[job].approval
        if approval is None or approval.done():
            self._refuse(what, f"{job} has no recovery waiting for approval", job=job)
        self._act(what, job=job)

    def checkpoint_now(self, job: str) -> None:
        self._live_job(f"checkpoint {job} now", job)
        if (kind := self.inv.jobs[job].spec.executor) != "torch":
            why = f"{job} runs the {kind} kind, which checkpoints on its own schedule only"
            self._refuse(f"checkpoint {job} now", why, job=job)
        self._act(f"checkpoint {job} now", job=job)
        self.jobs[job].request_checkpoint()

    def stop_job(self, job: str) -> None:
        self._live_job(f"stop {job}", job)
        self._act(f"stop {job}", job=job)
        self.jobs[job].request_stop()

    def start_job(self, job: str) -> None:
        """Start a stopped (or failed) job again: it resumes from its newest checkpoint."""
        sup = self.jobs[job]
        if not sup.state.is_terminal() or sup.state is JobState.FINISHED:
            why = f"{job} is {sup.state.value}; only a stopped or failed job can start"
            self._refuse(f"start {job}", why, job=job)
        if job in self._job_tasks and not self._job_tasks[job].done():
            self._refuse(f"start {job}", f"{job} is still winding down; try again", job=job)
        self._act(f"start {job}", job=job)
        sup.rec.stopped = False
        paid_off(sup.rec)  # an operator's start: a crash loop's count is not held against it
        self.store.save()
        self.jobs[job] = self._supervisor(job)
        self.jobs[job].live.carry_from(sup.live)
        self.jobs[job].launcher.carry_from(sup.launcher)
        self.jobs[job].starting_again = True
        # started again after an incident ended it: the resume is that fault's (no second one)
        n = carry_on(self.timeline.incidents(job), self.incidents, job)
        if n is not None:
            self.jobs[job].incident = n
        self._spawn(job)

    def drain_host(self, host: str) -> None:
        """Move every job off ``host`` with 0 lost steps, then leave it drained."""
        self._host_order("drain", host)
        jobs = [
            s
            for s in self.jobs.values()
            if host in s.hosts_in_use() and (s.state is JobState.RUNNING or s.state in ON_ITS_WAY)
        ]
        self.fleet.set_state(host, HostState.DRAINING, "operator")
        for sup in jobs:  # one on its way there moves once it trains (kept, moot if it left)
            sup.request_move(StopReason.DRAIN, f"operator drained {host}", off=host)
        if self.fleet.hosts[host].job is None:  # else drained once its job leaves it (Fleet.free)
            self.fleet.set_state(host, HostState.DRAINED, "no job holds it")

    def undrain(self, host: str) -> None:
        """A drained host takes jobs again."""
        self._host_order("undrain", host)
        self.fleet.set_state(host, HostState.UP, "operator: undrained")

    def cordon(self, host: str) -> None:
        self._host_order("cordon", host)
        self.fleet.set_state(host, HostState.CORDONED, "operator")

    def uncordon(self, host: str) -> None:
        self._host_order("uncordon", host)
        self.fleet.set_state(host, HostState.UP, "operator")

    def kill_host(self, host: str) -> None:
        """Demo: a local host dies as in a power cut: everything it runs is SIGKILLed (its
        executors, their runs and whatever those started) and the console can no longer reach it."""
        t, what = self.fleet.hosts[host].transport, f"kill demo host {host}"
        if not isinstance(t, LocalTransport):
            why = f"{host} is not a local demo host; only those can be killed from the console"
            self._refuse(what, why, host=host)
        if t.killed:
            self._refuse(what, f"{host} is killed already; revive brings it back", host=host)
        self._act(what, host=host)
        jobs = Path(self.inv.host_root(host)) / "jobs"
        roots: set[int] = set()
        for pidfile in [*jobs.glob("*/executor.pid"), *jobs.glob("*/twin.pid")]:  # twins too
            with contextlib.suppress(OSError, ValueError):
                roots.add(int(pidfile.read_text().strip()))
        t.kill_host(roots)  # everything the host runs: the executors' runs and their workers

    def revive_host(self, host: str) -> None:
        t, what = self.fleet.hosts[host].transport, f"revive demo host {host}"
        if not isinstance(t, LocalTransport):
            self._refuse(what, f"{host} is not a local demo host", host=host)
        if not t.killed:
            why = f"{host} was not killed; revive brings back a killed demo host"
            self._refuse(what, why, host=host)
        self._act(what, host=host)
        t.revive()
        self.fleet.changed.set()

    def add_host(self, name: str, table: dict[str, Any]) -> None:
        """Append ``[hosts.NAME]`` to the inventory file (comments kept) and start using it."""
        self._act(f"add host {name}", host=name)
        fresh = append_host(self.inv.path, name, table)
        self.inv.hosts[name] = fresh.hosts[name]
        self.fleet.add(name)
