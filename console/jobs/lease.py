"""The lease a console grants a job's executor, and the bound on it that outlives the console.

A lease is anchored to a reading of the executor's own clock (from a Heartbeat or Hello the
console had received), so it runs from an instant before the console sent it, on both
machines' monotonic clocks. The console's bound on it is when that reading *arrived* plus the
ttl, which is later than the executor's own end; ``clock_skew_s`` covers the clocks' rates.
The bound is persisted before the lease is sent: a console started after this one died
cannot see the lease, but it can wait out the bound.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

from console import clock
from console.fleet.link import ExecutorLink
from console.records.state_store import JobRecord, LeaseRecord, Unsaved
from protocol.messages import Lease, Start
from protocol.spec import JobSpec


class NoAnchor(Exception):
    """The executor has sent no clock reading yet: nothing to anchor a lease to."""


class Unpersisted(NoAnchor):
    """The lease's bound could not be written (the state's disk is full, or failing) and the
    bound already on disk does not cover it: not granted. Caught wherever NoAnchor is (no
    lease this time); the store has raised the alert and the next reading tries again."""


class JobLease:
    def __init__(
        self, rec: JobRecord, save: Callable[[], None], *, ttl_s: float, skew_s: float
    ) -> None:
        """``save``: persist the state (``StateStore.persist``: raises Unsaved when it could
        not); ``rec``'s lease is taken as what is on disk."""
        self._rec = rec
        self._save = save
        self._on_disk = rec.lease
        """The newest lease record known written: what a grant must stay within."""
        self.ttl_s = ttl_s
        self.skew_s = skew_s
        self.until = 0.0
        """``clock.mono()`` after which the newest lease granted has surely ended (skew not added)."""

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
        ttl = self.ttl_s if ttl is None else ttl
        executor_clock, arrived = link.anchor
        until = arrived + ttl
        prev = self._on_disk
        self.until = max(self.until, until)
        if prev is None or prev.epoch != epoch or until > prev.until:
            self._rec.lease = want = LeaseRecord(
                host=host,
                epoch=epoch,
                until=self.until,
                boot_id=clock.boot_id(),
                # the longest lease of this epoch that may still run (another boot waits it all)
                ttl_s=max(ttl, prev.ttl_s) if prev is not None and prev.epoch == epoch else ttl,
            )
            self._persist(host)  # before the lease leaves this machine
            self._on_disk = want
        return executor_clock

    def _persist(self, host: str) -> None:
        """The state on disk, or Unpersisted: a lease whose bound is not on disk is never sent.

        While the state cannot be written, a renewal still goes out if the bound already on
        disk covers it (same epoch, ending no later); past that, none does, and the executor,
        its lease then running out, stops before the bound a console started later would
        wait out. Nothing is ever granted past what is on disk."""
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
        if rec is not None and rec.boot_id == clock.boot_id():
            self.until = min(rec.until, now + rec.ttl_s)
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
