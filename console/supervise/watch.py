"""What a job supervisor watches while its executor runs, and how it reads a lost link.

Messages update the job; a dropped link is relinked after a blip, or classified (crash,
hang, host lost) once the executor is known dead or its lease has surely ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence

from console.fleet.detect import DetectionSettings, is_suspect, renewal_gap
from console.fleet.link import ExecutorLink, LinkError
from console.states import JobState
from console.supervise.incident import OpenIncident
from console.supervise.lease import JobLease, NoAnchor, renew_on_readings
from console.supervise.link_loss import LinkLoss
from console.supervise.live import LiveJob, Transitions
from console.supervise.member import Member
from console.supervise.messages import JobMessages
from console.supervise.outcome import Exit, Outcome
from console.supervise.policy import Decision, Policy, decide
from console.supervise.read_back import LINK_CLOSED, ReadBack
from console.supervise.standby import Standby
from protocol.messages import ExecutorMessage, RunEnded

POLL_S = 0.2


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
        detection: DetectionSettings,
        policy: Callable[[], Policy],
        lease: JobLease,
        incident: OpenIncident,
        standby: Standby,
        read_back: ReadBack,
        loss: LinkLoss,
        messages: JobMessages,
        leave: Callable[[Sequence[tuple[str, ExecutorLink]]], Awaitable[None]],
        keep_spares: Callable[[], Coroutine[None, None, None]] | None = None,
    ) -> None:
        self._live = live
        self._states = states
        self._detection = detection
        self._policy = policy
        self._lease = lease
        self._incident = incident
        self._standby = standby
        self._read_back = read_back
        """A checkpoint the run wrote that its link never delivered (``ReadBack``)."""
        self._messages = messages
        """Where the executor's messages go (the dispatcher every job has)."""
        self._ended = asyncio.Event()
        """Set when a message says the run ended while the executor stays (``RunEnded``)."""
        self._leave = leave
        """The console quits cleanly: the last lease (``LastLease.leave``)."""
        self._keep_spares = keep_spares
        """Runs while the executor does: replaces spares found unfit (``SpareKeeper.keep``)."""
        self._loss = loss
        """What a lost link means (the classifier every job uses)."""

    def new_executor(self) -> None:
        """Another executor, another clock: its pace is measured afresh."""
        if self._live.host is not None:
            self._messages.new_epoch([self._live.host])

    def heard(self, msg: ExecutorMessage) -> None:
        """What the job's executor said (node rank 0 of a group of one), done; a run that
        ended is the watch's end (one under a live executor, ``RunEnded``, at once: the
        executor stays, and its link with it)."""
        job = self._live
        assert job.host is not None
        end = self._messages.on_message(
            Member(0, job.host, link=job.link, last_seen=job.last_seen), msg
        )
        if end is None:
            return
        job.exit = end
        if isinstance(msg, RunEnded):  # a restart in place needs no new executor
            job.faulted = job.link
            self._ended.set()

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
                    await self.read_back(job.exit)
                    return job.exit
                why = await pump
                outcome = await self.after_link_loss(why)
                if outcome is not None:
                    await self.read_back(outcome)
                    return outcome
        except asyncio.CancelledError:
            if job.link is not None and job.host is not None:  # the console quits: the job
                await self._leave([(job.host, job.link)])  # trains on without it
            raise
        finally:
            for task in tasks:
                task.cancel()
            job.link = None

    async def read_back(self, outcome: Outcome, unheard: str = LINK_CLOSED) -> None:
        """A checkpoint the run wrote and the console never heard of, read from the executor's
        events (``ReadBack``, one path for every job's executors)."""
        job = self._live
        if job.host is not None:
            member = Member(0, job.host, link=job.link, last_seen=job.last_seen)
            await self._read_back.read_back(member, outcome, unheard)

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
