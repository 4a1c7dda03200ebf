"""What a host says about a job's executor when its link cannot: is it alive (its workdir's
lock held), how did it end (its events.jsonl), and ending a hung one by the lock's pid.
"""

from __future__ import annotations

import asyncio
import posixpath
import time
from collections.abc import Callable

from console.inventory import Inventory
from console.jobs.launcher import START_TIMEOUT_S
from console.jobs.live import Alert
from console.jobs.outcome import Exit, Outcome, from_events_tail
from console.reach.deploy import job_dir
from console.reach.remote import KillStatus, executor_alive, kill_executor
from console.reach.transport.base import Transport, TransportError
from console.records.journal import Journal, Kind

POLL_S = 0.2
REAP_BUDGET_S = 10.0
"""How long a move waits on the old host's reaping before the lease bound and fence cover it."""
TAIL_BYTES = 64 * 1024


class Probe:
    def __init__(
        self,
        job: str,
        *,
        inv: Inventory,
        transport: Callable[[str], Transport],
        journal: Journal,
        alert: Alert,
    ) -> None:
        self.job = job
        self._inv = inv
        self._transport = transport
        self._journal = journal
        self._alert = alert

    def workdir(self, host: str) -> str:
        return job_dir(self._inv.host_root(host), self.job)

    async def alive(self, host: str, workdir: str, budget: float) -> bool | None:
        """Is the executor alive (lock held)? None when the host cannot be asked within ``budget``."""
        try:
            async with asyncio.timeout(budget):
                return await executor_alive(
                    self._transport(host), self._inv.python(host), workdir, timeout=budget
                )
        except (TransportError, TimeoutError):
            return None

    async def wait_gone(self, host: str, probe_s: float = 3.0) -> bool | None:
        """Until no executor holds this job's lock on ``host`` (one may still be exiting).

        True once seen gone; False if one still held it at the deadline; None if the host
        could not be asked (unreachable is not gone).
        """
        workdir = self.workdir(host)
        deadline = time.monotonic() + START_TIMEOUT_S / 6
        while time.monotonic() < deadline:
            alive = await self.alive(host, workdir, probe_s)
            if alive is None:
                return None
            if alive is False:
                return True
            await asyncio.sleep(POLL_S)
        return False

    async def kill(self, host: str, workdir: str) -> None:
        """End a hung executor by the pid that holds its workdir's lock, never by a name pattern
        (one would match another job's executor whose workdir shares a prefix); the outcome is
        journaled, and a kill that did not happen is an alert."""
        try:
            result = await kill_executor(self._transport(host), self._inv.python(host), workdir)
        except TransportError as e:
            self._alert(
                f"{self.job}: could not kill the hung executor on {host}: {e}",
                job=self.job,
                host=host,
            )
            return
        self._journal.record(
            Kind.EXECUTOR,
            f"{self.job}: killing the hung executor on {host}: {result.why}",
            job=self.job,
            host=host,
            data={
                "kill": result.status.name.lower(),
                "pid": result.pid,
                "holders": result.holders,
                "reaped": result.reaped,
            },
        )
        if result.status not in (KillStatus.KILLED, KillStatus.NOT_HELD):
            self._alert(
                f"{self.job}: the hung executor on {host} was not killed cleanly: {result.why}",
                job=self.job,
                host=host,
            )

    async def reap(self, host: str) -> bool:
        """Before a job moves off a host the console can reach: whatever is left there of its
        run (an executor still exiting, the run's cgroup, the processes carrying its token) is
        killed and seen gone. True when it was; False (journaled, an alert) when the host did
        not answer or something outlived SIGKILL: then the lease bound and the host's fence
        are what keep the old run from training beside the next."""
        workdir = self.workdir(host)
        try:
            async with asyncio.timeout(REAP_BUDGET_S):
                result = await kill_executor(
                    self._transport(host), self._inv.python(host), workdir, timeout=5
                )
        except (TransportError, TimeoutError) as e:
            self._journal.record(
                Kind.EXECUTOR,
                f"{self.job}: could not reap the old run on {host} before moving: "
                f"{e or 'no answer in time'}",
                job=self.job,
                host=host,
                data={"reap": "unanswered"},
            )
            return False
        clean = result.status in (KillStatus.KILLED, KillStatus.NOT_HELD)
        if result.reaped or result.status is KillStatus.KILLED or not clean:
            self._journal.record(
                Kind.EXECUTOR,
                f"{self.job}: reaped the old run on {host} before moving: {result.why}"
                f" ({result.reaped} process(es) of its command)",
                job=self.job,
                host=host,
                data={"reap": result.status.name.lower(), "reaped": result.reaped},
            )
        if not clean:
            self._alert(
                f"{self.job}: the old run on {host} was not reaped cleanly: {result.why}",
                job=self.job,
                host=host,
            )
        return clean

    async def ended(self, host: str) -> Outcome:
        """The executor is gone: how did it end? Its events.jsonl says."""
        t = self._transport(host)
        path = posixpath.join(self.workdir(host), "events.jsonl")
        try:
            st = await t.stat(path)
            chunks = [
                c
                async for c in t.read_chunks(
                    path, offset=max(0, (st.size if st else 0) - TAIL_BYTES)
                )
            ]
        except TransportError:
            return Outcome(Exit.CRASHED, "the executor is gone and its events cannot be read")
        return from_events_tail(b"".join(chunks).decode(errors="replace"))
