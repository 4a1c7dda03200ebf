"""One epoch of a multi-host job: every member's link pumped, its lease renewed, its silence
noticed, until each member's run has ended (or the whole group finished).

A member whose link is lost is relinked if it was a blip; otherwise the host is asked (its
workdir's lock) and, if it cannot be asked, its lease is waited out before it is called lost:
a member cut off may still be training under the lease it holds. Members keep being renewed
while they answer, so a survivor whose collective fails (its peer died) stays warm, waiting
for the next epoch's Start; one still stuck after the collective timeout is left to its lease.
A member still joining when another's run ends is told the epoch is abandoned, and waits warm.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Sequence

import msgspec

from console import clock
from console.fleet.detect import DetectionSettings, is_suspect, renewal_gap
from console.fleet.link import ExecutorLink, LinkError
from console.supervise.group.member_events import send_quietly
from console.supervise.lease import JobLease, NoAnchor, renew_on_readings
from console.supervise.link_loss import LinkLoss
from console.supervise.member import Member
from console.supervise.outcome import (
    CRASHES,
    Exit,
    Outcome,
)
from protocol.messages import (
    Abandon,
    ExecutorMessage,
    Fault,
    Heartbeat,
    Lease,
    Rendezvous,
    RunEnded,
    Start,
)
from protocol.spec import JobSpec

POLL_S = 0.2


class GroupEpoch:
    """Given what it needs: the lease (persisted bound), the detection settings, the
    classifier of a lost link, and where each message and each member's silence goes."""

    def __init__(
        self,
        members: list[Member],
        *,
        epoch: int,
        resume: int | None = None,
        lease: JobLease,
        detection: DetectionSettings,
        loss: LinkLoss,
        on_message: Callable[[Member, ExecutorMessage], Outcome | None],
        collective_timeout_s: float,
        silent: Callable[[Member], None],
        lost: Callable[[Member, str, str], None],
        unreachable: Callable[[Member], None] = lambda _m: None,
        answered: Callable[[Member, list[Member]], Awaitable[None]],
        leave: Callable[[Sequence[tuple[str, ExecutorLink | None]]], Awaitable[None]],
    ) -> None:
        self.members = members
        self.epoch = epoch
        self.resume = resume
        """The committed step its members were told to resume from (None: step 0, or a run
        found at console start, whose step this console did not choose)."""
        self._lease = lease
        self._det = detection
        self._loss = loss
        """What a member's lost link means (the classifier every job uses)."""
        self._on_message = on_message
        self._collective_s = collective_timeout_s
        self._silent = silent
        """Tells the supervisor of a member gone silent (the job waits out its lease)."""
        self._lost = lost
        """Tells the supervisor of a member whose silence is decided a loss (its lease ran
        out): (member, why, fault class); the incident opens then, not before."""
        self._unreachable = unreachable
        """Tells the supervisor of a member whose host cannot be asked (it may ready a
        replacement while the lease runs out; an idle executor trains nothing)."""
        self._answered = answered
        """Tells the supervisor of a member that answers again after a silence, with the
        members whose run has not ended."""
        self._leave = leave
        """The console quits cleanly: the last lease to each member still training
        (``LastLease.leave``, one path for every job)."""
        self._changed = asyncio.Event()
        self._telling: set[asyncio.Task[None]] = set()
        """Abandons on their way (``_abandon``)."""
        self.first: Member | None = None
        """The member whose run ended first: the origin of this epoch's end."""

    # ---------------------------------------------------------------- lease

    def start(self, m: Member, spec: JobSpec, rendezvous: Rendezvous) -> Start:
        """The Start for ``m``: its first lease bounded here and persisted (the max of all)."""
        assert m.link is not None and m.link.anchor is not None
        start = self._lease.start(m.link, m.host, spec, self.epoch)
        m.until = max(m.until, m.link.anchor[1] + self._lease.ttl_s)
        return msgspec.structs.replace(
            start,
            rank=rendezvous.node_rank * rendezvous.procs_per_host,
            world_size=rendezvous.world_size,
            rendezvous=rendezvous,
        )

    def grant(self, m: Member, link: ExecutorLink | None = None) -> Lease:
        """A renewal for ``m`` over ``link`` (its own), its bound kept here and persisted (the
        max of all)."""
        link = link or m.link
        assert link is not None and link.anchor is not None
        lease = self._lease.renewal(link, m.host, self.epoch)
        m.until = max(m.until, link.anchor[1] + self._lease.ttl_s)
        return lease

    def left(self, m: Member) -> float:
        return m.until + self._lease.skew_s - clock.mono()

    # ---------------------------------------------------------------- watch

    async def watch(self) -> list[Member]:
        """Until every member's run has ended; the members, each with its ``exit``."""
        tasks = [asyncio.create_task(self._member(m)) for m in self.members]
        tasks += [asyncio.create_task(self._renew(m)) for m in self.members]
        tasks.append(asyncio.create_task(self._liveness()))
        try:
            while not all(m.exit is not None for m in self.members):
                self._changed.clear()
                await self._changed.wait()
            return self.members
        except asyncio.CancelledError:  # the console quits: the members train on without it
            await self._leave([(m.host, m.link) for m in self.members if m.exit is None])
            raise
        finally:
            for t in [*tasks, *self._telling]:
                t.cancel()
            await asyncio.gather(*tasks, *self._telling, return_exceptions=True)
            for m in self.members:
                if m.link is not None:
                    m.link.close()

    def ended(self, m: Member, outcome: Outcome) -> None:
        if m.exit is not None:
            return
        m.exit, m.exit_at = outcome, time.monotonic()
        if self.first is None:
            self.first = m
            if outcome.exit is not Exit.FINISHED:
                self._abandon([x for x in self.members if x.exit is None])
        self._changed.set()

    def _abandon(self, others: list[Member]) -> None:
        """The first member's run ended, so this epoch's group will not form if it has not yet:
        each other member still linked is told (``Abandon``), and one still joining ends now,
        warm, instead of waiting out the join's timeout (then its lease) for a member that will
        never come. One past its join goes on, and its collectives fail as before."""
        for x in others:
            if x.link is not None:
                task = asyncio.create_task(send_quietly(x.link, Abandon(epoch=self.epoch)))
                self._telling.add(task)
                task.add_done_callback(self._telling.discard)

    def ending(self) -> bool:
        return self.first is not None

    def origin(self) -> Member | None:
        """The member whose failure ended the epoch: the first to end, unless that one ended
        waiting (RunEnded: its collective failed) after another member's executor had gone
        quiet (killed, hung, cut off), whose end the console learns only by probe or lease."""
        first = self.first
        if first is None or not first.waiting:
            return first
        gone = [
            m
            for m in self.members
            if m.exit is not None
            and not m.waiting
            and m.exit.exit in (*CRASHES, Exit.HUNG, Exit.HOST_LOST)
            and m.last_seen <= first.exit_at
        ]
        return min(gone, key=lambda m: m.last_seen, default=first)

    async def _member(self, m: Member) -> None:
        while m.exit is None:
            if m.link is not None:
                why = await m.link.pump(lambda msg: self._message(m, msg))
                m.link = None
                if m.exit is not None:
                    return
            else:
                why = "not linked"
            outcome = await self._after_loss(m, why)
            if outcome is not None:
                self.ended(m, outcome)

    def _message(self, m: Member, msg: ExecutorMessage) -> None:
        if not isinstance(msg, (Fault,)):
            m.last_seen = time.monotonic()
        if isinstance(msg, Heartbeat):
            m.step = max(m.step, msg.step)
        end = self._on_message(m, msg)  # the one dispatcher: what the message means
        if isinstance(msg, RunEnded):  # its executor stays, warm, for the next epoch
            m.waiting = True
        if end is not None:
            self.ended(m, end)

    async def _renew(self, m: Member) -> None:
        """``m``'s lease, renewed at each of its executor's clock readings while it may train."""

        async def renew(link: ExecutorLink) -> None:
            if m.exit is not None and not m.waiting:
                return
            if (
                not m.waiting
                and self.first is not None
                and time.monotonic() - self.first.exit_at > self._collective_s + 2.0
            ):
                return  # stuck past the collective timeout: left to its lease
            with contextlib.suppress(LinkError, NoAnchor):
                await link.send(self.grant(m, link))

        await renew_on_readings(lambda: m.link, renew, renewal_gap(self._det))

    async def _liveness(self) -> None:
        """A hung executor keeps its connection but stops heartbeating: close its link."""
        while True:
            await asyncio.sleep(POLL_S)
            now = time.monotonic()
            for m in self.members:
                if (
                    m.link is not None
                    and m.exit is None
                    and is_suspect(now, m.last_seen, self._det)
                ):
                    m.link.close()

    async def _after_loss(self, m: Member, why: str) -> Outcome | None:
        """Relink after a blip; otherwise find out what happened, waiting out the lease
        (``LinkLoss``, the classifier every job uses)."""
        return await self._loss.classify(m.host, why, _MemberSide(self, m, why))


class _MemberSide:
    """A member's side of a lost link (``link_loss.Side``): its lease bound is its own, the
    job is told of its silence and of its loss, a replacement is readied while its host cannot
    be asked, and a run that ended while unlinked leaves a warm executor for the next epoch."""

    def __init__(self, run: GroupEpoch, m: Member, why: str) -> None:
        self._run = run
        self._m = m
        self._why = why

    @property
    def epoch(self) -> int:
        return self._run.epoch

    def last_seen(self) -> float:
        return self._m.last_seen

    def left(self) -> float:
        return self._run.left(self._m)

    async def answered(self, link: ExecutorLink) -> None:
        m, run = self._m, self._run
        m.link, m.last_seen = link, time.monotonic()
        with contextlib.suppress(LinkError, NoAnchor):
            await link.send(run.grant(m))
        await run._answered(m, [x for x in run.members if x.exit is None])

    def faulted(self, link: ExecutorLink) -> Outcome:
        link.close()
        return Outcome(Exit.RUN_CRASHED, f"the run on {self._m.host} ended while unlinked")

    def silent(self) -> None:
        self._run._silent(self._m)

    def unreachable(self) -> None:
        self._run._unreachable(self._m)

    def lost(self, fault_class: str) -> None:
        self._run._lost(self._m, self._why, fault_class)
