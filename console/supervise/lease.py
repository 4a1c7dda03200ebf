"""The lease a console grants a job's executor, and the bound on it that outlives the console.

A lease is anchored to a reading of the executor's own clock (from a Heartbeat or Hello the
console had received), so it runs from an instant before the console sent it, on both
machines' monotonic clocks. The console's bound on it is when that reading *arrived* plus the
ttl, which is later than the executor's own end; ``clock_skew_s`` covers the clocks' rates.
The bound is persisted before the lease is sent: a console started after this one died
cannot see the lease, but it can wait out the bound. The persisted bound runs a little ahead
of the one kept here (``PERSIST_AHEAD``): later is safe, and it is written less often.

Renewals go out as the executor's clock readings arrive (``renew_on_readings``), not on a
timer: a lease runs from its reading, so one sent by a timer is already as old as the wait
for the timer when it leaves, and the executor stops its run with up to half its lease left
(room to checkpoint). Anchored to each heartbeat, a lease reaches the executor with nearly its
whole ttl, and what a busy machine delays is the heartbeat and its answer, not a timer's phase.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable
from itertools import pairwise

from console import clock, loop_watch
from console.fleet.link import ExecutorLink, LinkError
from console.records.state_store import JobRecord, LeaseRecord, Unsaved
from protocol.errors import HotspareError
from protocol.messages import Lease, Start
from protocol.spec import JobSpec

SENT_KEPT = 256
IDLE_S = 0.2
"""How often a renewal loop with no link to renew on looks again."""
PERSIST_AHEAD = 1 / 3
"""The bound persisted runs this part of a lease ahead of the newest lease granted, so leases
renewed at every heartbeat write the state about three times a lease, not at each one; a
console restarted on an unreachable host waits that much longer, never less."""


class NoAnchor(HotspareError):
    """The executor has sent no clock reading yet: nothing to anchor a lease to."""

    permanent = False


class Unpersisted(NoAnchor):
    """The lease's bound could not be written (the state's disk is full, or failing) and the
    bound already on disk does not cover it: not granted. Caught wherever NoAnchor is (no
    lease this time); the store has raised the alert and the next reading tries again."""


class JobLease:
    def __init__(
        self,
        rec: JobRecord,
        save: Callable[[], object],
        *,
        ttl_s: float,
        skew_s: float,
        vouch: Callable[[], None] = lambda: None,
    ) -> None:
        """``save``: persist the state (``StateStore.persist``: raises Unsaved when it could
        not); ``rec``'s lease is taken as what is on disk. ``vouch``: raises Unsaved when
        this controller may not grant at all (``StateStore.vouch``: not sure it leads)."""
        self._rec = rec
        self._save = save
        self._vouch = vouch
        self._on_disk = rec.lease
        """The newest lease record known written: what a grant must stay within."""
        self.ttl_s = ttl_s
        self.skew_s = skew_s
        self.until = 0.0
        """``clock.mono()`` after which the newest lease granted has surely ended (skew not added)."""
        self._sent: dict[str, deque[tuple[float, float]]] = {}
        """Per host, (``clock.mono()`` when a lease was granted, the age of its reading then)."""

    # ------------------------------------------------------------ granting

    def start(self, link: ExecutorLink, host: str, spec: JobSpec, epoch: int) -> Start:
        """A Start whose first lease is bounded and persisted, with the job's run id (made and
        persisted at its first start); send it next."""
        if not self._rec.run_id:
            self._rec.run_id = uuid.uuid4().hex
            self._persist(host)
        anchor = self._grant(link, host, epoch)
        return Start(
            spec=spec,
            epoch=epoch,
            lease_s=self.ttl_s,
            lease_anchor=anchor,
            run_id=self._rec.run_id,
        )

    def renewal(
        self, link: ExecutorLink, host: str, epoch: int, ttl_s: float | None = None
    ) -> Lease:
        """A Lease bounded and persisted; send it next. ``ttl_s``: a longer one than usual (the
        last lease of a console that quits, so training goes on without it)."""
        ttl = max(self.ttl_s, ttl_s or 0.0)
        anchor = self._grant(link, host, epoch, ttl)
        return Lease(epoch=epoch, ttl_s=ttl, anchor=anchor)

    def _grant(self, link: ExecutorLink, host: str, epoch: int, ttl: float | None = None) -> float:
        if link.anchor is None:
            raise NoAnchor(f"{host}: the executor has sent no clock reading")
        try:
            self._vouch()
        except Unsaved as e:
            raise Unpersisted(f"{host}: no lease: {e}") from None
        ttl = self.ttl_s if ttl is None else ttl
        executor_clock, arrived = link.anchor
        until = arrived + ttl
        now = clock.mono()
        loop_watch.ensure()  # watched from the first lease on: evidence if one lapses
        prev = self._on_disk
        same = prev is not None and prev.epoch == epoch and prev.boot_id == clock.boot_id()
        # the longest lease of this epoch that may still run (another boot waits it all)
        longest = max(ttl, prev.ttl_s) if prev is not None and prev.epoch == epoch else ttl
        self.until = max(self.until, until)
        if not same or prev is None or until > prev.until or longest > prev.ttl_s:
            self._rec.lease = want = LeaseRecord(
                host=host,
                epoch=epoch,
                until=self.until + self.ttl_s * PERSIST_AHEAD,
                boot_id=clock.boot_id(),
                ttl_s=longest,
            )
            self._persist(host)  # before the lease leaves this machine
            self._on_disk = want
        sent = self._sent.setdefault(host, deque(maxlen=SENT_KEPT))
        sent.append((now, now - arrived))
        return executor_clock

    def _persist(self, host: str) -> None:
        """The state on disk, or Unpersisted: a lease whose bound is not on disk is never sent.

        While the state cannot be written, a renewal still goes out if the bound already on
        disk covers it (same epoch and boot, no longer a ttl, ending no later): the bound
        runs ``PERSIST_AHEAD`` of a lease ahead, so renewals go on that long, and the
        executor, its lease then running out, stops before the bound a console started
        later would wait out. Nothing is ever granted past what is on disk."""
        try:
            self._save()
        except Unsaved as e:
            raise Unpersisted(f"{host}: no lease past the bound on disk: {e}") from None

    # ------------------------------------------------------------ waiting

    def restore(self) -> None:
        """A new console: take the bound the console before it persisted.

        From another boot of this machine the bound cannot be read, so the whole ttl is waited
        from now; a record with an epoch but no lease (written before leases were persisted)
        is treated the same.
        """
        rec = self._rec.lease
        now = clock.mono()
        if rec is not None and rec.boot_id == clock.boot_id():  # as written: it ran ahead
            self.until = min(rec.until, now + rec.ttl_s + self.ttl_s * PERSIST_AHEAD)
        elif rec is not None:
            self.until = now + rec.ttl_s
        elif self._rec.epoch > 0:
            self.until = now + self.ttl_s
        else:
            self.until = 0.0

    def left(self) -> float:
        """Seconds until the newest lease has surely ended, clock skew included (<= 0: ended)."""
        return self.until + self.skew_s - clock.mono()

    def ended(self) -> bool:
        return self.left() <= 0

    # ------------------------------------------------------------ evidence

    def evidence(self, host: str, link: ExecutorLink | None) -> dict[str, float | None]:
        """What tells a lease lapse under load from a real loss, over the last lease to ``host``:
        when the newest lease was granted and how old its reading was then, the longest gap
        between grants, the longest stall of the console's loop, the least lease the executor
        said was left when a renewal reached it, and when it was last heard from (seconds;
        None: nothing to say).

        Over the last lease: the lease before the newest grant and everything since, so that a
        stall longer than a lease (a laptop asleep, a write blocked for seconds) still shows
        the grant it outlived."""
        now = clock.mono()
        every = list(self._sent.get(host, ()))
        since = (every[-1][0] if every else now) - self.ttl_s
        watch, began = loop_watch.for_loop(), time.monotonic() - (now - since)
        sent = [(t, age) for t, age in every if t >= since]
        before = [t for t, _ in every if t < since][-1:] or [since]
        times = [*before, *(t for t, _ in sent), now]
        lows = [low for t, low in (link.lease_lows if link else ()) if t >= since]
        return {
            "granted_ago_s": now - sent[-1][0] if sent else None,
            "reading_age_s": sent[-1][1] if sent else None,
            "grant_gap_s": max(b - a for a, b in pairwise(times)),
            # watched from the first grant on (``_grant``): so was every grant in the window
            "loop_stall_s": watch.stall(max(began, watch.started_at)) if every else None,
            "lease_low_s": min(lows) if lows else None,
            "heard_ago_s": now - link.anchor[1] if link and link.anchor else None,
        }


def lapse_note(e: dict[str, float | None]) -> str:
    """``JobLease.evidence`` in words, for the journal line of a lapsed lease."""

    def s(key: str) -> str:
        v = e.get(key)
        return "?" if v is None else f"{v:.2f} s"

    return (
        f"the last lease was granted {s('granted_ago_s')} before, on a reading {s('reading_age_s')} "
        f"old; over the last lease, grants at most {s('grant_gap_s')} apart, the console's loop "
        f"stalled {s('loop_stall_s')} at most, renewals reached the executor with "
        f"{s('lease_low_s')} left at the least; last heard from {s('heard_ago_s')} before"
    )


async def fresh_anchor(link: ExecutorLink, timeout_s: float) -> None:
    """Before a Start: a clock reading taken now (``ExecutorLink.fresh_reading``, a Ping
    answered), waited for up to ``timeout_s``. A Start anchored to an older reading starts a
    lease already partly spent, or wholly: a console loop that stalled with the executor's
    heartbeats queued unread reads them all at once afterwards, each as if just arrived, and a
    Start on one of those found its 3 s lease over at once (fresh-clone runs, twice:
    test_state_disk_full; an arrival-age check did not see it). Past the timeout, or with the
    link gone, it grants on what it has (a Start on a closed link fails where it is sent).

    The group's Starts do not wait so: their members' links are not read before the Start,
    and a wait there held every member's Start up a lease long (3 group tests failed)."""
    await asyncio.sleep(0)  # a pump just created for the link starts reading
    if not link.pumped:
        return  # nothing reads the answer (a link read only once it trains)
    with contextlib.suppress(LinkError):
        await link.fresh_reading(timeout_s)


async def renew_on_readings(
    current: Callable[[], ExecutorLink | None],
    renew: Callable[[ExecutorLink], Awaitable[None]],
    gap_s: float,
) -> None:
    """Renew a lease at each clock reading from the executor on ``current()``'s link at least
    ``gap_s`` newer than the one the last renewal was anchored to (a new link: at once).

    ``renew`` grants and sends (and swallows a lost link). Runs until cancelled.
    """
    granted: tuple[ExecutorLink, float] | None = None
    while True:
        link = current()
        if link is None or link.closed or link.hello is None or link.anchor is None:
            await asyncio.sleep(IDLE_S)
            continue
        if granted is not None and granted[0] is link:
            fresh = await link.reading_after(granted[1] + gap_s, timeout=1.0)
            if not fresh:
                continue
        assert link.anchor is not None
        granted = (link, link.anchor[0])
        with contextlib.suppress(NoAnchor):  # not granted (its bound not on disk): next reading
            await renew(link)
