"""A read-only console's view of a job: it follows the job through the state file the
owning console writes and through the executor's own messages, and acts on nothing.

It sends no Lease, no Start, no Stop and never fails over, so any number of read-only
consoles can watch a fleet beside the one console that holds the state dir.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from console.fleet.link import ExecutorLink, LinkError
from console.states import FailureKind, JobState

if TYPE_CHECKING:
    from console.jobs.supervisor import JobSupervisor

FOLLOW_EVERY_S = 2.0


class Observe:
    """Mixed into JobSupervisor."""

    async def _observe(self: JobSupervisor) -> None:
        while True:
            self.rec = self.ctl.store.job(self.name)  # the store was read again by the controller
            host = self.rec.host
            if self.rec.finished_sha256:
                self.sha256, self.step = self.rec.finished_sha256, self.rec.finished_step or 0
                self._observed(JobState.FINISHED, "finished (seen in the state file)")
                return
            if self.rec.stopped:
                self.failure = FailureKind.STOPPED
                self._observed(JobState.FAILED, "stopped by an operator")
            elif host and host in self.ctl.fleet.hosts:
                self.host = host
                link = ExecutorLink(
                    self.ctl.fleet.hosts[host].transport, self._socket(host), self.ctl.console_id
                )
                try:
                    hello = await link.open(timeout=5)
                except LinkError as e:
                    self._observed(JobState.PENDING, f"executor on {host} not reachable: {e}")
                else:
                    self.step, self.last_seen = hello.step, time.monotonic()
                    self._observed(JobState.RUNNING, f"on {host}, epoch {hello.epoch} (watching)")
                    self.link = link
                    why = await link.pump(self._on_message)
                    self.link = None
                    self._observed(JobState.PENDING, f"lost sight of {host}: {why}")
            else:
                self._observed(JobState.PENDING, "not placed yet")
            await asyncio.sleep(FOLLOW_EVERY_S)

    def _observed(self: JobSupervisor, state: JobState, why: str) -> None:
        """A read-only console mirrors, it does not decide: any state may follow any other."""
        if state is not self.state:
            self.machine.state = state
        self.why = why
