"""Executors readied on another host: a failover's target while the old lease runs out, and
the warm standby. Each link has one reader for its whole life, so a readied executor's link
becomes the job's link without a gap.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

from console.fleet.link import ExecutorLink, LinkError
from console.reach.transport.base import TransportError
from console.records.journal import Kind
from console.states import HostState
from protocol.messages import ExecutorMessage, Health, Heartbeat, Stop

if TYPE_CHECKING:
    from console.jobs.supervisor import JobSupervisor


@dataclass
class Prepared:
    """An idle executor on a host other than the job's, ready to be told Start."""

    host: str
    link: ExecutorLink
    promoted: bool = False
    """The newest replica is already in place as its checkpoint."""


class Standby:
    """Mixed into JobSupervisor."""

    # ------------------------------------------------------------ preparation

    async def _prepare_failover(self: JobSupervisor, old: str) -> Prepared | None:
        """While the lost host's lease runs out: replica in place and an idle executor up on the target.

        Nothing trains until Start, which is sent only after the lease has ended.
        """
        standby = self.standby
        if standby is not None and standby.host != old and self._pumping(standby.link):
            try:
                await self._ensure_replica(standby.host)
                await self._promote(standby.host)
            except TransportError:
                return None
            self.standby = None
            return Prepared(standby.host, standby.link, promoted=True)
        target = await self._pick_target(old)
        if target is None:
            return None
        fleet = self.ctl.fleet
        fleet.hosts[target].job = self.name
        started: ExecutorLink | object = None
        try:
            await self._ensure_replica(target)
            started = await self._start_executor(target, promote_replica=True)
        except TransportError:
            pass
        finally:  # also when cancelled: the target is free again unless readied
            if not isinstance(started, ExecutorLink) and fleet.hosts[target].job == self.name:
                fleet.hosts[target].job = None
        return (
            Prepared(target, started, promoted=True) if isinstance(started, ExecutorLink) else None
        )

    async def _cancel_preparation(self: JobSupervisor) -> None:
        self.early_phases = []
        task, self._preparing = self._preparing, None
        if task is None:
            return
        task.cancel()
        result = await asyncio.gather(task, return_exceptions=True)
        if isinstance(result[0], Prepared):
            await self._discard(result[0])

    async def _discard(self: JobSupervisor, prepared: Prepared) -> None:
        """Stop a readied executor that will not be used, and wait until it has let go of the
        workdir: the next executor started there (a failover may pick the same host again)
        must not find it still holding the lock and serving the socket."""
        if prepared.link.hello is not None:
            self.dismissed.add((prepared.host, prepared.link.hello.pid))
        with contextlib.suppress(LinkError):
            await prepared.link.send(Stop(reason="not needed", checkpoint=False))
        prepared.link.close()
        if prepared.host != self.host:
            await self._wait_gone(prepared.host)
        rt = self.ctl.fleet.hosts[prepared.host]
        if rt.job == self.name and prepared.host != self.host:
            rt.job = None

    # ------------------------------------------------------------------ pumps

    def _pump(self: JobSupervisor, link: ExecutorLink) -> asyncio.Task[str]:
        """One reader per link for its whole life, so a standby's link can become the job's link."""
        task = self._pumps.get(id(link))
        if task is None:
            task = asyncio.create_task(link.pump(lambda msg: self._route(link, msg)))
            self._pumps[id(link)] = task
        return task

    def _pumping(self: JobSupervisor, link: ExecutorLink) -> bool:
        task = self._pumps.get(id(link))
        return link.hello is not None and task is not None and not task.done()

    def _route(self: JobSupervisor, link: ExecutorLink, msg: ExecutorMessage) -> None:
        if link is self.link:
            self._on_message(msg)
            return
        host = link.transport.name
        if isinstance(msg, Heartbeat):
            self.ctl.fleet.seen(host)
        elif isinstance(msg, Health):
            self.ctl.fleet.observe(host, msg)

    # ------------------------------------------------------------ warm standby

    async def _keep_standby(self: JobSupervisor) -> None:
        """An idle executor on the first live spare: torch imported and warmed up, waiting for Start."""
        fleet = self.ctl.fleet
        spare = next((s for s in self.spares if fleet.hosts[s].state is HostState.UP), None)
        current = self.standby
        if current is not None and current.host == spare and self._pumping(current.link):
            return
        if current is not None:
            self.standby = None
            await self._discard(current)
        if spare is None:
            return
        fleet.hosts[spare].job = self.name
        started = await self._start_executor(spare, promote_replica=False)
        if isinstance(started, ExecutorLink):
            self.standby = Prepared(spare, started)
            self.ctl.journal.record(
                Kind.EXECUTOR,
                f"{self.name}: warm standby ready on {spare}",
                job=self.name,
                host=spare,
                data={"standby": True},
            )
        elif fleet.hosts[spare].job == self.name:
            fleet.hosts[spare].job = None

    async def _drop_standby(self: JobSupervisor) -> None:
        task, self._standby_task = self._standby_task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        standby, self.standby = self.standby, None
        if standby is not None:
            await self._discard(standby)
