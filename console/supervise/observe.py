"""A read-only console's view of a job: it follows the job through the state file the
owning console writes and through the executor's own messages, and acts on nothing.

It sends no Lease, no Start, no Stop and never fails over, so any number of read-only
consoles can watch a fleet beside the one console that holds the state dir.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any

from console.fleet.hosts import Fleet
from console.fleet.link import ExecutorLink, LinkError
from console.records.state_store import JobRecord
from console.states import JobState
from console.supervise.live import LiveJob
from protocol.messages import ExecutorMessage

FOLLOW_EVERY_S = 2.0


class Observe:
    def __init__(
        self,
        live: LiveJob,
        *,
        record: Callable[[], JobRecord],
        fleet: Fleet,
        link: Callable[[str], ExecutorLink],
        on_message: Callable[[ExecutorMessage], object],
        look: Callable[[JobRecord], Coroutine[Any, Any, None]],
    ) -> None:
        self._live = live
        self._record = record
        """The job's record as last read from the state file (the controller reads it again)."""
        self._fleet = fleet
        self._link = link
        """A new, unopened link to the job's executor on a host."""
        self._on_message = on_message
        self._look = look
        """Read the replicas the record's spares hold now (the owning console's copies)."""
        self._looked: list[str] | None = None
        """The spares whose replicas were read last: read again when the record names others."""

    async def observe(self) -> None:
        job = self._live
        while True:
            job.rec = self._record()
            if job.rec.spares != self._looked:  # at start, and when the owner chose others
                self._looked = list(job.rec.spares)
                await self._look(job.rec)
            host = job.rec.host
            if job.rec.finished:
                job.sha256, job.step = job.rec.finished_sha256, job.rec.finished_step or 0
                self._observed(JobState.FINISHED, "finished (seen in the state file)")
                return
            if job.rec.stopped:
                job.failure = None
                self._observed(JobState.STOPPED, "stopped by an operator")
            elif host and host in self._fleet.hosts:
                job.host = host
                link = self._link(host)
                try:
                    hello = await link.open(timeout=5)
                except LinkError as e:
                    self._observed(JobState.PENDING, f"executor on {host} not reachable: {e}")
                else:
                    job.step, job.last_seen = hello.step, time.monotonic()
                    self._observed(JobState.RUNNING, f"on {host}, epoch {hello.epoch} (watching)")
                    job.link = link
                    why = await link.pump(self._heard)
                    job.link = None
                    self._observed(JobState.PENDING, f"lost sight of {host}: {why}")
            else:
                self._observed(JobState.PENDING, "not placed yet")
            await asyncio.sleep(FOLLOW_EVERY_S)

    def _heard(self, msg: ExecutorMessage) -> None:
        """A message from the executor; the record is read again too (the state file is
        reloaded while the link stays open: a new epoch, a spare changed)."""
        self._live.rec = self._record()
        self._on_message(msg)

    def _observed(self, state: JobState, why: str) -> None:
        """A read-only console mirrors, it does not decide: any state may follow any other."""
        if self._live.told:  # the controller's own word is shown instead
            return
        if state is not self._live.state:
            self._live.machine.state = state
        self._live.why = why
