"""What a job supervisor watches while its executor runs, and how it reads a lost link.

Messages update the job; a dropped link is relinked after a blip, or classified (crash,
hang, host lost) once the executor is known dead or its lease has surely ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import Callable, Coroutine

from console import clock
from console.fleet.detect import ClockPace, DetectionSettings, is_suspect, renewal_gap
from console.fleet.hosts import Fleet
from console.fleet.link import ExecutorLink, LinkError
from console.inventory import Inventory
from console.jobs.incident import PREEMPTED_WHY, OpenIncident, trained_past
from console.jobs.lease import JobLease, NoAnchor, lapse_note, renew_on_readings
from console.jobs.link_loss import LinkLoss
from console.jobs.live import Alert, LiveJob, Transitions
from console.jobs.outcome import Exit, Outcome, from_finished, from_run_ended, from_stopped
from console.jobs.policy import Decision, Policy, decide
from console.jobs.probe import Probe
from console.jobs.replicator import Replicator, Source
from console.jobs.standby import Standby
from console.reach.deploy import checkpoint_file
from console.records.journal import Journal, Kind
from console.records.lineage import journal_fields
from console.states import HostState, JobState
from protocol.faults import FaultKind
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

POLL_S = 0.2
LEAVE_TIMEOUT_S = 2.0
READ_BACK_TIMEOUT_S = 30.0
"""Reading an ended run's events.jsonl for a checkpoint its link did not deliver."""


def _clock() -> str:
    return time.strftime("%H:%M:%S")


WARN_EVERY_S = 60.0
"""The same executor warning is journalled at most this often."""


class Watch:
    """Messages, liveness and what a lost link means."""

    def __init__(
        self,
        live: LiveJob,
        *,
        states: Transitions,
        inv: Inventory,
        fleet: Fleet,
        journal: Journal,
        alert: Alert,
        detection: DetectionSettings,
        policy: Callable[[], Policy],
        lease: JobLease,
        save: Callable[[], object],
        replicator: Replicator,
        incident: OpenIncident,
        standby: Standby,
        probe: Probe,
        loss: LinkLoss,
        link: Callable[[str], ExecutorLink],
        progress: Callable[[Progress], None],
        move: Callable[[str, str], None],
        keep_spares: Callable[[], Coroutine[None, None, None]] | None = None,
        acts: bool = True,
    ) -> None:
        self._live = live
        self._states = states
        self._inv = inv
        self._fleet = fleet
        self._journal = journal
        self._journalled: dict[str, float] = {}
        """Each executor warning (numbers aside): when it was last journalled."""
        self._alert = alert
        self._detection = detection
        self._policy = policy
        self._lease = lease
        self._save = save
        """Persist the job's record."""
        self._replicator = replicator
        self._incident = incident
        self._standby = standby
        self._probe = probe
        self._link = link
        """A new, unopened link to the job's executor on a host."""
        self._progress = progress
        """Tell the console of a Progress message (it journals some)."""
        self._move = move
        """Ask for a planned move off the host: (reason, why)."""
        self._keep_spares = keep_spares
        """Runs while the executor does: replaces spares found unfit (``SpareKeeper.keep``)."""
        self._acts = acts
        """False for a read-only console: messages update the view, and nothing is done about
        them (no incident opened, no drain, no restart count reset)."""
        self._pace = ClockPace(inv.console.lease_s)
        self._loss = loss
        """What a lost link means (the classifier every job uses)."""
        self._warned = 0
        self._ended = asyncio.Event()
        """Set when a message says the run ended while the executor stays (``RunEnded``)."""

    def new_executor(self) -> None:
        """Another executor, another clock: its pace is measured afresh."""
        self._pace = ClockPace(self._inv.console.lease_s)

    # ---------------------------------------------------------------- watch

    async def watch(self) -> Outcome:
        """Until the executor's run has ended (relinking after blips); how it ended."""
        job = self._live
        job.exit = None
        self._ended.clear()
        tasks = [asyncio.create_task(self._renew_leases()), asyncio.create_task(self._liveness())]
        if self._keep_spares is not None:
            tasks.append(asyncio.create_task(self._keep_spares()))
        try:
            while True:
                assert job.link is not None
                pump = self._standby.pump(job.link)
                ended = asyncio.create_task(self._ended.wait())
                try:  # the link closing, or a run that ended under a live executor
                    await asyncio.wait({pump, ended}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    ended.cancel()
                if job.exit is not None:
                    await self._read_back(job.exit)
                    return job.exit
                why = await pump
                outcome = await self.after_link_loss(why)
                if outcome is not None:
                    await self._read_back(outcome)
                    return outcome
        except asyncio.CancelledError:
            await self._leave()  # the console quits: the job trains on without it
            raise
        finally:
            for task in tasks:
                task.cancel()
            job.link = None

    async def _read_back(self, outcome: Outcome) -> None:
        """A run that says it checkpointed at a step the console never heard of (its link
        closed, or was relinked, before that CheckpointSaved was read): the checkpoint is taken
        from the executor's events.jsonl as if it had come over the link, so the failover copies
        it and resumes there, not from the one before (a preemption's checkpoint at the stop
        lost 11 steps so). Only a checkpoint of this epoch is taken."""
        job = self._live
        if outcome.exit in (Exit.FINISHED, Exit.CONFIG, Exit.STOPPED):
            return  # the job goes nowhere
        known = job.checkpoint.step if job.checkpoint is not None else -1
        said = outcome.checkpoint_step if outcome.checkpoint_step is not None else -1
        saved = outcome.saved
        if job.host is None or max(said, saved.manifest.step if saved else -1) <= known:
            return
        if saved is None or saved.manifest.step < said:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(READ_BACK_TIMEOUT_S):
                    saved = (await self._probe.ended(job.host)).saved
        if saved is None or saved.manifest.epoch != job.epoch or saved.manifest.step <= known:
            return
        self._journal.record(
            Kind.EXECUTOR,
            f"{job.name}: checkpoint step {saved.manifest.step} read back from the events of "
            f"the executor on {job.host} (its link closed before it said so)",
            job=job.name,
            host=job.host,
            data={"step": saved.manifest.step, "read_back": True},
        )
        self.on_message(saved)

    async def _leave(self) -> None:
        """The console quits cleanly: a last lease of ``unattended_s`` (persisted like any), so
        training goes on and a console started within it reattaches. Best effort, quickly."""
        job, unattended = self._live, self._inv.console.unattended_s
        link, host = job.link, job.host
        if link is None or link.hello is None or host is None or job.state is not JobState.RUNNING:
            return
        if unattended <= self._inv.console.lease_s:
            return
        try:
            async with asyncio.timeout(LEAVE_TIMEOUT_S):
                await link.send(self._lease.renewal(link, host, job.epoch, ttl_s=unattended))
        except (LinkError, NoAnchor, TimeoutError) as e:
            self._journal.record(
                Kind.EXECUTOR,
                f"{job.name}: the last lease before quitting did not reach {host}: {e}",
                job=job.name,
                host=host,
            )
            return
        self._journal.record(
            Kind.EXECUTOR,
            f"{job.name}: the executor on {host} may train on for {unattended:g} s without a "
            "console (its last lease)",
            job=job.name,
            host=host,
            data={"unattended_s": unattended, "epoch": job.epoch},
        )

    async def _renew_leases(self) -> None:
        job = self._live

        async def renew(link: ExecutorLink) -> None:
            if job.host is not None:
                with contextlib.suppress(LinkError):
                    await link.send(self._lease.renewal(link, job.host, job.epoch))

        await renew_on_readings(lambda: job.link, renew, renewal_gap(self._detection))

    async def _liveness(self) -> None:
        """A hung executor keeps its connection but stops heartbeating: close the link to react."""
        job = self._live
        while True:
            await asyncio.sleep(POLL_S)
            if job.link is not None and is_suspect(
                time.monotonic(), job.last_seen, self._detection
            ):
                job.link.close()

    # ------------------------------------------------------------- messages

    def on_message(self, msg: ExecutorMessage) -> None:
        job = self._live
        assert job.host is not None
        if isinstance(msg, Heartbeat):
            job.last_seen = time.monotonic()
            self._fleet.seen(job.host)
            self._check_pace(msg.clock)
        elif isinstance(msg, Progress):
            job.last_seen = time.monotonic()
            job.step, job.loss, job.steps_per_s = msg.step, msg.loss, msg.steps_per_s
            job.history.append((clock.wall(), msg.step, msg.loss, msg.steps_per_s))
            if (
                job.incident is not None
                and job.resumed_step is not None
                and trained_past(msg, job.resumed_step)
            ):
                self._incident.phase("first_step", step=msg.step)
                job.incident = None
            self._progress(msg)
        elif isinstance(msg, CheckpointSaved):
            job.checkpoint = msg.manifest
            job.checkpoint_path = checkpoint_file(
                self._inv.host_root(job.host), job.name, msg.manifest.step
            )
            job.checkpoints.append((job.host, msg.manifest))
            self._journal.record(
                Kind.CHECKPOINT,
                f"{job.name}: checkpoint step {msg.manifest.step} on {job.host}",
                job=job.name,
                host=job.host,
                data={
                    "step": msg.manifest.step,
                    "bytes": msg.manifest.size,
                    "stall_s": msg.stall_s,
                    "write_s": msg.write_s,
                    "epoch": msg.manifest.epoch,
                    **journal_fields(msg.manifest),
                },
            )
            if msg.manifest.epoch == job.epoch:
                self._replicator.submit(
                    job.name, job.spares, Source(job.host, job.checkpoint_path, msg.manifest)
                )
                if self._acts and job.rec.restarts and msg.manifest.step > (job.resumed_step or 0):
                    self._restarts_paid_off(msg.manifest.step)
        elif isinstance(msg, Resumed):
            job.resumed_step = msg.step
            self._incident.phase(
                "loaded", step=msg.step, load_s=msg.load_s, checkpoint=msg.checkpoint
            )
        elif isinstance(msg, Health):
            self._on_health(msg)
        elif isinstance(msg, Fault):
            job.log_tail.append(f"{_clock()} FAULT {msg.fault}: {msg.message}")
            self._on_fault(msg)
        elif isinstance(msg, Log):
            job.log_tail.append(f"{_clock()} {msg.level.upper()} {msg.text}")
            if msg.level in ("warning", "error") and self._fresh_warning(msg.text):
                self._journal.record(
                    Kind.WARNING,
                    f"{job.name} on {self._live.host}: {msg.text}",
                    job=job.name,
                    host=self._live.host,
                    data={"level": msg.level},
                )
        elif isinstance(msg, Finished):
            job.exit = from_finished(msg.step, msg.params_sha256, msg.warnings)
        elif isinstance(msg, Stopped):
            job.exit = from_stopped(msg.reason, msg.step, msg.checkpoint_step)
        elif isinstance(msg, RunEnded):  # the executor stays: a restart in place needs no new one
            job.log_tail.append(f"{_clock()} RUN ENDED {msg.fault}: {msg.message}")
            job.exit = from_run_ended(msg.fault, msg.message, msg.step)
            job.faulted = job.link
            self._ended.set()

    def _fresh_warning(self, text: str) -> bool:
        """An executor's warning is journalled (the command's own lines never are), the same
        one (numbers aside: "120 lines dropped") at most once a minute."""
        key = re.sub(r"\d+", "#", text)
        now = time.monotonic()
        if now - self._journalled.get(key, -WARN_EVERY_S) < WARN_EVERY_S:
            return False
        self._journalled[key] = now
        return True

    def _check_pace(self, executor_clock: float) -> None:
        drift = self._pace.sample(executor_clock, clock.mono())
        skew = self._inv.console.clock_skew_s
        if drift is not None and abs(drift) > skew:
            self._alert(
                f"{self._live.host}: its clock and the console's drifted {drift:+.2f} s apart "
                f"over one lease, more than clock_skew_s ({skew:g} s): leases may not hold; "
                "raise clock_skew_s or check the host's clock",
                host=self._live.host,
            )

    def _restarts_paid_off(self, step: int) -> None:
        """A checkpoint past the step a restart resumed from: the job got over that crash, so
        ``restart_limit`` counts again from zero (it bounds a crash loop, not crashes ever)."""
        job = self._live
        self._journal.record(
            Kind.EXECUTOR,
            f"{job.name}: checkpoint at step {step} after {job.rec.restarts} restart(s); "
            "the restart count starts again",
            job=job.name,
            host=job.host,
            data={"restarts": job.rec.restarts, "step": step},
        )
        job.rec.restarts = 0
        self._save()

    def _on_fault(self, msg: Fault) -> None:
        job = self._live
        assert job.host is not None
        text, data = f"{job.name} on {job.host}: {msg.fault}: {msg.message}", {}
        if msg.fault == FaultKind.LEASE_LOST.value:
            data = self._lease.evidence(job.host, job.link)
            text += f" ({lapse_note(data)})"
        self._journal.record(
            Kind.FAULT,
            text,
            job=job.name,
            host=job.host,
            data={"fault": msg.fault, "step": msg.step, **data},
        )
        if not self._acts:
            return
        if msg.fault == FaultKind.PREEMPTED and job.incident is None:
            self._incident.open("preemption", PREEMPTED_WHY, planned=True)
        if msg.fault in (FaultKind.NAN, FaultKind.OOM) and job.incident is None:
            self._incident.in_executor(msg.fault, msg.step, msg.message)
        if msg.fault == FaultKind.CONFIG:
            job.exit = Outcome(Exit.CONFIG, msg.message)

    def _on_health(self, msg: Health) -> None:
        job, fleet = self._live, self._fleet
        host = job.host
        assert host is not None
        fleet.observe(host, msg)
        if not self._acts:
            return
        failing = fleet.failing(host)
        if failing and job.state is JobState.RUNNING:
            why = "; ".join(f.message for f in failing)
            self._alert(f"{host}: GPU FAIL ({why}): draining and moving {job.name}", host=host)
            fleet.set_state(host, HostState.DRAINING, f"GPU FAIL: {why}")
            self._move("gpu_fail", f"GPU FAIL on {host}: {why}")
        warns = [
            f
            for f in fleet.hosts[host].findings
            if f.rule in ("throttle", "temperature", "pcie_replays")
        ]
        self._warned = self._warned + 1 if warns else 0
        if self._warned == 5 and self._policy().value == "auto" and job.state is JobState.RUNNING:
            self._move("migrate", f"GPU WARN on {host}: {warns[0].message}")

    # ------------------------------------------------------- after link loss

    async def after_link_loss(self, why: str, *, seen_silent: bool = True) -> Outcome | None:
        """Relink after a blip; otherwise find out what happened, waiting out the lease where it
        matters (``LinkLoss``, the classifier every job uses).

        ``seen_silent`` is False for a console that has not yet heard the executor (its own
        start): no silence was seen, so no incident opens unless the loss is decided (an
        executor slow to answer on a loaded machine is no fault).
        """
        host = self._live.host
        assert host is not None
        return await self._loss.classify(host, why, _OneHost(self, host, why, seen_silent))


class _OneHost:
    """A single-host job's side of a lost link (``link_loss.Side``): the job reads unreachable
    while its host is silent, a target is readied while the host cannot be asked, an incident
    opens once the loss is decided, and an answer again undoes what the silence did."""

    def __init__(self, watch: Watch, host: str, why: str, seen_silent: bool) -> None:
        self._w = watch
        self._host = host
        self._why = why
        self._seen_silent = seen_silent
        self._before = watch._live.state

    @property
    def epoch(self) -> int:
        return self._w._live.epoch

    def last_seen(self) -> float:
        return self._w._live.last_seen

    def left(self) -> float:
        return self._w._lease.left()

    async def answered(self, link: ExecutorLink) -> None:
        w, job = self._w, self._w._live
        job.link = link
        job.last_seen = time.monotonic()
        with contextlib.suppress(LinkError, NoAnchor):  # at once: it may be about to end
            await link.send(w._lease.renewal(link, self._host, job.epoch))
        await w._standby.cancel_preparation()
        if job.state is JobState.UNREACHABLE:
            w._states.move(self._before, f"{self._host} answers again")

    def faulted(self, link: ExecutorLink) -> Outcome:
        """Its run ended while unlinked: restarted in place on the executor that waits."""
        w, job = self._w, self._w._live
        job.faulted = link
        job.last_seen = time.monotonic()
        if link.hello is not None:
            job.step = max(job.step, link.hello.step)
        w._standby.pump(link)
        return Outcome(Exit.RUN_CRASHED, f"the run on {self._host} ended while unlinked")

    def silent(self) -> None:
        w, job = self._w, self._w._live
        if job.state in (JobState.RUNNING, JobState.CHECKPOINTING):
            w._states.move(
                JobState.UNREACHABLE,
                f"waiting out the lease on {self._host}: {max(0.0, w._lease.left()):.0f} s left",
            )

    def unreachable(self) -> None:
        """Ready the target now (an idle executor trains nothing); a blip cancels it."""
        w = self._w
        if not w._standby.preparing and decide(w._policy(), failover=True) is Decision.ACT:
            w._standby.begin_preparation(self._host)

    def lost(self, fault_class: str) -> None:
        """The silence is decided a loss (its lease ran out): its incident opens now, dated
        from the last heartbeat. Not before: a silence that ends in a relink is a blip, no
        incident (a loaded machine's late heartbeats opened one that "recovered" at once)."""
        if self._seen_silent:
            self._w._incident.open(fault_class, self._why)
