"""A console that quits cleanly (``q``, Ctrl-C, ``hotspare stop``) leaves each of the job's
executors still training a last lease of ``console.unattended_s``, persisted like any, so
training goes on without a console and one started within it reattaches with no incident.

One path for every job: a single host's executor and each member of a group alike (issue 30:
a group's members got none, and stopped one lease after a clean quit).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from console.fleet.link import ExecutorLink, LinkError
from console.records.journal import Journal, Kind
from console.states import JobState
from console.supervise.lease import JobLease, NoAnchor
from console.supervise.live import LiveJob

LEAVE_TIMEOUT_S = 2.0
"""Best effort, quickly: a console that quits does not wait on a host that does not answer."""

TRAINING = frozenset({JobState.RUNNING, JobState.CHECKPOINTING, JobState.UNREACHABLE})
"""The states in which an executor of the job may be training: each gets its last lease.
Unreachable too (run M: a heartbeat late on a loaded host had closed the link as suspect; the
console that quit then sent nothing, said nothing, and the executor, alive, stopped at its
lease's end three seconds later)."""


class LastLease:
    """Given the job's live view, its lease, a way to dial a host's executor afresh, the
    settings and the journal."""

    def __init__(
        self,
        live: LiveJob,
        *,
        lease: JobLease,
        dial: Callable[[str], ExecutorLink],
        unattended_s: float,
        journal: Journal,
    ) -> None:
        self._live = live
        self._lease = lease
        self._dial = dial
        self._unattended_s = unattended_s
        self._journal = journal

    async def leave(self, members: Sequence[tuple[str, ExecutorLink | None]]) -> None:
        """Each (host, its link or None while silent) of a member whose run has not ended gets
        its last lease, at once; none when nothing of the job trains, or the setting is no
        longer than a lease."""
        if self._live.state not in TRAINING or self._unattended_s <= self._lease.ttl_s:
            return
        await asyncio.gather(*(self._one(h, link) for h, link in members))

    async def _one(self, host: str, link: ExecutorLink | None) -> None:
        job, unattended = self._live, self._unattended_s
        try:
            async with asyncio.timeout(LEAVE_TIMEOUT_S):
                await self._send(host, link)
        except (LinkError, NoAnchor, TimeoutError) as e:
            self._journal.record(
                Kind.EXECUTOR,
                f"{job.name}: the last lease before quitting did not reach {host}: "
                f"{e or f'no answer in {LEAVE_TIMEOUT_S:g} s'}",
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

    async def _send(self, host: str, link: ExecutorLink | None) -> None:
        """Over the member's link while it is read; else (silent: its link was closed as
        suspect, or it fails now) over a link dialled afresh, to the executor of this epoch
        only. Delivered only once the executor says so (``_deliver``)."""
        if link is not None and link.pumped:
            try:
                await self._deliver(host, link)
                return
            except LinkError:
                pass
        fresh = self._dial(host)
        pump: asyncio.Task[str] | None = None
        try:
            hello = await fresh.open(timeout=LEAVE_TIMEOUT_S)
            if hello.epoch != self._live.epoch:
                raise LinkError(f"its executor is at epoch {hello.epoch}, not {self._live.epoch}")
            pump = asyncio.create_task(fresh.pump(lambda _msg: None))
            await self._deliver(host, fresh)
        finally:
            fresh.close()
            if pump is not None:
                await asyncio.gather(pump, return_exceptions=True)

    async def _deliver(self, host: str, link: ExecutorLink) -> None:
        """The lease, then a Ping: the Heartbeat answering it says the lease it left. A lease
        sent and the link closed at once could be lost (run M: the executor, busy as the link
        closed, wrote to it first, failed, and its reader dropped the frames it had not handed
        out, the lease among them; ``ExecutorLink.finish``); answered, it was handled."""
        unattended = self._unattended_s
        await link.send(self._lease.renewal(link, host, self._live.epoch, ttl_s=unattended))
        beat = await link.answer(LEAVE_TIMEOUT_S)
        if beat is None:
            raise LinkError("no answer after the lease was sent")
        left = beat.lease_left_s
        if left is not None and left <= self._lease.ttl_s:
            raise LinkError(f"the executor refused it ({left:.1f} s of lease left)")
