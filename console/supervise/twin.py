"""The warm twin (``warm_twin = true``): an idle executor for the job on the job's own host,
started once the job's executor runs, which becomes the job's executor when that executor's
process is gone (``executors/agent/twin.py``), so a restart in place is a Start, not a process start.

Example sequence: ``a running (pid 10), twin pid 11 ready -> pid 10 SIGKILLed -> restart on a
(epoch 2): Start to pid 11 -> running in pid 11 -> twin pid 12 ready``. The twin itself refuses
a Start while the job's executor still holds the workdir, so it never makes a second trainer.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from console.fleet.link import ExecutorLink, LinkError
from console.records.journal import Journal, Kind
from console.supervise.launcher import Launcher
from console.supervise.live import LiveJob
from protocol.faults import StopReason
from protocol.messages import Stop

POLL_S = 0.2


class Twin:
    def __init__(
        self,
        live: LiveJob,
        *,
        launcher: Launcher,
        journal: Journal,
        pump: Callable[[ExecutorLink], object],
        pumping: Callable[[ExecutorLink], bool],
    ) -> None:
        self._live = live
        self._launcher = launcher
        self._journal = journal
        self._pump = pump
        """Read the twin's link for its whole life (``Standby.pump``): it may become the job's."""
        self._pumping = pumping
        self.host: str | None = None
        self.link: ExecutorLink | None = None
        """The idle twin, linked, on ``host``."""
        self._task: asyncio.Task[None] | None = None

    def keep(self) -> None:
        """Have a twin beside the job's executor (in the background, once it has made a step)."""
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._keep(), name=f"{self._live.name} twin")

    def take(self, host: str) -> ExecutorLink | None:
        """The twin on ``host`` to restart the job in (its executor's process is gone), if it is
        up; it stops being the twin (the next launch starts another)."""
        link, self.link = self.link, None
        if link is not None and self.host == host and self._pumping(link):
            self._journal.record(
                Kind.EXECUTOR,
                f"{self._live.name}: restart in the warm twin on {host}"
                + (f" (pid {link.hello.pid})" if link.hello else ""),
                job=self._live.name,
                host=host,
                data={"pid": link.hello.pid if link.hello else None, "twin": True},
            )
            return link
        if link is not None:
            self._stop(link)
        return None

    async def cancel_keep(self) -> None:
        """The keeping of a twin is called off (its supervision ends, the console quits): a
        task of this job never outlives it (one did, and wrote to the journal its console had
        closed, as the standby's once had). A twin already up is left to its idle exit."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def drop(self) -> None:
        """No twin: the job ended or moves to another host (a twin must not sit on memory)."""
        await self.cancel_keep()
        link, self.link = self.link, None
        if link is not None:
            self._stop(link)

    # ----------------------------------------------------------------- inside

    async def _keep(self) -> None:
        job = self._live
        host, primary = job.host, job.link
        if host is None or primary is None:
            return
        last = job.history[-1] if job.history else None
        while not job.history or job.history[-1] is last:  # its first step: it runs
            if job.link is not primary:
                return
            await asyncio.sleep(POLL_S)
        if self.link is not None and self.host == host and self._pumping(self.link):
            return
        if self.link is not None:
            self._stop(self.link)
            self.link = None
        started = await self._launcher.start_twin(host)
        if isinstance(started, str):
            self._journal.record(
                Kind.EXECUTOR,
                f"{job.name}: no warm twin on {host}: {started}",
                job=job.name,
                host=host,
                data={"twin": True},
            )
            return
        self._pump(started)
        self.host, self.link = host, started
        self._journal.record(
            Kind.EXECUTOR,
            f"{job.name}: warm twin ready on {host}"
            + (f" (pid {started.hello.pid})" if started.hello else ""),
            job=job.name,
            host=host,
            data={"pid": started.hello.pid if started.hello else None, "twin": True},
        )

    def _stop(self, link: ExecutorLink) -> None:
        """Tell an unused twin to stop (it holds no workdir lock: nothing waits on its exit)."""
        host, pid = link.transport.name, link.hello.pid if link.hello else None
        if pid is not None:
            self._launcher.dismissed.add((host, pid))
        self._journal.record(
            Kind.EXECUTOR,
            f"{self._live.name}: warm twin on {host} told to stop (not needed)",
            job=self._live.name,
            host=host,
            data={"pid": pid, "twin": True},
        )

        async def stop() -> None:
            with contextlib.suppress(LinkError, TimeoutError):
                async with asyncio.timeout(5):
                    await link.send(Stop(reason=StopReason.NOT_NEEDED, checkpoint=False))
            await link.finish()

        self._launcher.outlive(stop())
