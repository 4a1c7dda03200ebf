"""A console that quits cleanly (``q``, Ctrl-C, ``hotspare stop``) leaves each of the job's
executors still training a last lease of ``console.unattended_s``, persisted like any, so
training goes on without a console and one started within it reattaches with no incident.

One path for every job: a single host's executor and each member of a group alike (issue 30:
a group's members got none, and stopped one lease after a clean quit).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from console.fleet.link import ExecutorLink, LinkError
from console.records.journal import Journal, Kind
from console.states import JobState
from console.supervise.lease import JobLease, NoAnchor
from console.supervise.live import LiveJob

LEAVE_TIMEOUT_S = 2.0
"""Best effort, quickly: a console that quits does not wait on a host that does not answer."""


class LastLease:
    """Given the job's live view, its lease, the settings and the journal."""

    def __init__(
        self,
        live: LiveJob,
        *,
        lease: JobLease,
        unattended_s: float,
        journal: Journal,
    ) -> None:
        self._live = live
        self._lease = lease
        self._unattended_s = unattended_s
        self._journal = journal

    async def leave(self, links: Sequence[tuple[str, ExecutorLink]]) -> None:
        """Each (host, link) of an executor that trains the job now gets its last lease, at
        once; none when the job is not running, or the setting is no longer than a lease."""
        if self._live.state is not JobState.RUNNING or self._unattended_s <= self._lease.ttl_s:
            return
        live = [(h, link) for h, link in links if link.hello is not None]
        await asyncio.gather(*(self._one(h, link) for h, link in live))

    async def _one(self, host: str, link: ExecutorLink) -> None:
        job, unattended = self._live, self._unattended_s
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
