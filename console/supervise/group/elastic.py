"""An elastic multi-host job's size: shrink when a member is lost and no host can take its
rank, grow back when a host is free again.

The job is planned on ``hosts`` (its planned size) and trains on no fewer than ``min_hosts``.
A shrink is decided by the group's recovery (``may_shrink``); a grow is started here: while the
group trains shrunk, a free host (fit, free, not another job's spare) is made one of the job's
spares, so the shards written at the next stop reach it, and the group is stopped with a
checkpoint at its next step (a planned move, 0 lost steps). The recovery then starts the next
epoch on the members and the newcomer (``take``), which loads the replica of that step.

The training keeps the planned run's global batch at any size: the executors run the job's
logical ranks (``Rendezvous.logical_ranks``) by gradient accumulation.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from console.fleet.hosts import Fleet
from console.inventory import Inventory
from console.records.journal import Journal, Kind
from console.spares.placement import rank
from console.states import JobState
from console.supervise.live import LiveJob
from console.supervise.policy import Policy
from protocol.faults import StopReason

CHECK_EVERY_S = 1.0
"""How often a shrunk group looks for a host to grow back onto (and when the fleet changes)."""


class Growth:
    """Given the job's inventory entry, the fleet, what the job holds now, and how to ask for a
    planned move (``Orders.request_move``)."""

    def __init__(
        self,
        live: LiveJob,
        *,
        inv: Inventory,
        fleet: Fleet,
        journal: Journal,
        policy: Callable[[], Policy],
        members: Callable[[], list[str]],
        reserved: Callable[[], dict[str, str]],
        move: Callable[[StopReason, str], None],
        save: Callable[[], object],
    ) -> None:
        self._live = live
        self._name = live.name
        self._inv = inv
        self._fleet = fleet
        self._journal = journal
        self._policy = policy
        self._members = members
        """The job's hosts now, by node rank."""
        self._reserved = reserved
        """Spares held by live jobs: host -> job."""
        self._move = move
        """Stop the group with a checkpoint for a planned move (reason, why)."""
        self._save = save
        self.planned = len(inv.members(live.name))
        self.min_hosts = inv.min_hosts(live.name)
        self._newcomer: str | None = None

    @property
    def elastic(self) -> bool:
        return self.min_hosts < self.planned

    def may_shrink(self, hosts: int) -> bool:
        """May the job train on ``hosts`` members (fewer than planned)?"""
        return self.elastic and self.min_hosts <= hosts

    def take(self) -> str | None:
        """The host a grow was started for (once), if it can still take a rank."""
        host, self._newcomer = self._newcomer, None
        if host is None or host in self._members() or not self._fleet.fit(host):
            return None
        rt = self._fleet.hosts[host]
        return host if rt.job in (None, self._name) else None

    def candidate(self) -> str | None:
        """A host the shrunk group could grow onto now: its own spares first, then the nearest
        free host that is no other job's spare."""
        members = self._members()
        if not self.elastic or len(members) >= self.planned:
            return None
        usable = self._fleet.usable(exclude=set(members))
        reserved = self._reserved()
        spares = [s for s in self._live.spares if s in usable]
        others = [h for h in usable if reserved.get(h) in (None, self._name) and h not in spares]
        home = self._inv.hosts[members[0]].region
        return (spares + rank(self._inv, home, others) + [None])[0]

    async def watch(self) -> None:
        """While the group trains shrunk: grow as soon as a host is free (cancelled with the
        epoch's watch). Operators' planned moves go ahead under every policy but observe."""
        job = self._live
        while True:
            self._fleet.changed.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(CHECK_EVERY_S):
                    await self._fleet.changed.wait()
            if (
                job.state is not JobState.RUNNING
                or job.incident is not None
                or job.link is None
                or self._policy() is Policy.OBSERVE
            ):
                continue
            host = self.candidate()
            if host is None:
                continue
            self._grow(host)
            return

    def _grow(self, host: str) -> None:
        job, members = self._live, self._members()
        if host not in job.spares:
            job.spares = [*job.spares, host]
            job.rec.spares = list(job.spares)
            self._save()
        self._newcomer = host
        size = f"{len(members)} -> {len(members) + 1} of {self.planned} hosts"
        self._journal.record(
            Kind.PLACEMENT,
            f"{self._name}: {host} is free: growing ({size}) at the next step",
            job=self._name,
            host=host,
            data={"grow": host, "members": members, "planned": self.planned},
        )
        self._move(StopReason.GROWN, f"{host} is free: growing {size}")
