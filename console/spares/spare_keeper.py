"""A running job's spares kept fit: a spare found unfit while the job trains (down, drained,
cordoned, or failing a health rule or the health probe) is replaced by the best usable host,
and the newest checkpoint is sent there at once, so a failover finds a replica where it goes.
A job with no spare at all takes one as soon as a usable host no other job holds appears (added
by hand, provisioned, back up).

Without this, a spare that broke after placement kept receiving replicas (or failing to), and
a failover went to another host that held none. A spare is replaced only when there is a host
to replace it with (else the host monitor's alert says the job has no healthy spare); a spare
another job holds is never taken here.

The same for a single host's job and a group (issue 30): ``hosts`` are the hosts the job trains
on (a group's members, none of which is chosen as a spare), and ``send_newest`` sends the
newest checkpoint there (a group's: every member's newest shard). A group's unfit spare was
never replaced: a member lost later failed over to a host that held no replica of its shard.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from console.fleet.hosts import Fleet
from console.inventory import Inventory
from console.records.journal import Journal, Kind
from console.spares.placement import choose_spares
from console.states import HostState, JobState
from console.supervise.live import LiveJob

KEEP_EVERY_S = 2.0
GRACE_S = 2 * KEEP_EVERY_S
"""A spare is replaced once it has been unfit this long: one missed probe (a flap) is not
enough to move a job's replicas elsewhere."""
REPLACED_WITHIN_S = GRACE_S + 2 * KEEP_EVERY_S
"""An unfit spare that a usable host can replace is replaced within this: the grace, then a
round of the keeper, and one more for a round that came just before it was due."""
UNFIT_STATES = {
    HostState.DOWN: "down",
    HostState.DRAINING: "draining",
    HostState.DRAINED: "drained",
    HostState.CORDONED: "cordoned",
}


class SpareKeeper:
    def __init__(
        self,
        live: LiveJob,
        *,
        inv: Inventory,
        fleet: Fleet,
        journal: Journal,
        hosts: Callable[[], list[str]],
        send_newest: Callable[[list[str]], None],
        reserved: Callable[[], dict[str, str]],
        priorities: Callable[[], dict[str, int]],
        save: Callable[[], object],
        after: Callable[[], None] = lambda: None,
    ) -> None:
        self._live = live
        self._inv = inv
        self._fleet = fleet
        self._journal = journal
        self._hosts = hosts
        """The hosts the job trains on now (a group's members by node rank): never its spares."""
        self._send_newest = send_newest
        """Send the job's newest checkpoint (every member's shard) to these new spares."""
        self._reserved = reserved
        """Spares held by other live jobs: host -> job."""
        self._priorities = priorities
        self._save = save
        """Persist the job's record."""
        self._after = after
        """Run after each round (the warm standby follows the spares)."""
        self._unfit_since: dict[str, float] = {}
        """When each spare was first seen unfit (monotonic), until it is fit again."""

    async def keep(self) -> None:
        """Check every ``KEEP_EVERY_S`` while the job trains (cancelled with the watch)."""
        while True:
            await asyncio.sleep(KEEP_EVERY_S)
            self.check()
            self._after()

    def unfit(self, spare: str) -> str | None:
        """Why ``spare`` cannot take the job now, or None if it can."""
        rt = self._fleet.hosts.get(spare)
        if rt is None:
            return "no longer in the inventory"
        if rt.state in UNFIT_STATES:
            return UNFIT_STATES[rt.state]
        if rt.job is not None and rt.job != self._live.name:
            return f"running {rt.job}"
        failing = self._fleet.failing(spare)
        return "; ".join(f.message for f in failing) if failing else None

    def check(self, now: float | None = None) -> dict[str, str]:
        """Replace the spares unfit for ``GRACE_S`` that a usable host can replace, or take one
        for a job that has none; returns old -> new (old "" for one taken)."""
        job = self._live
        hosts = self._hosts()
        if not hosts or job.state is not JobState.RUNNING:
            return {}
        now = time.monotonic() if now is None else now
        if not job.spares:
            return self._take_one(hosts)
        unfit = {s: w for s in job.spares if (w := self.unfit(s)) is not None}
        for s in set(self._unfit_since) - set(unfit):
            del self._unfit_since[s]
        why = {
            s: w for s, w in unfit.items() if now - self._unfit_since.setdefault(s, now) >= GRACE_S
        }
        if not why:
            return {}
        keep = [s for s in job.spares if s not in why]
        chosen = self._choose(hosts, {*hosts, *keep}, len(why))
        replaced = dict(zip(why, chosen, strict=False))
        if not replaced:
            return {}
        job.spares = [replaced.get(s, s) for s in job.spares]
        job.rec.spares = list(job.spares)
        self._save()
        for old, new in replaced.items():
            self._journal.record(
                Kind.PLACEMENT,
                f"{job.name}: spare {old} is unfit ({why[old]}): replaced by {new}",
                job=job.name,
                host=new,
                data={"spares": job.spares, "replaced": old, "why": why[old], "change": "spare"},
            )
        self._send_newest(list(replaced.values()))
        return replaced

    def _take_one(self, hosts: list[str]) -> dict[str, str]:
        """A job with no spare at all takes a usable host no other job holds, once there is one
        (added, provisioned, back up), and sends it the newest checkpoint."""
        job = self._live
        chosen = self._choose(hosts, set(hosts), 1)
        if not chosen:
            return {}
        job.spares = chosen
        job.rec.spares = list(job.spares)
        self._save()
        self._journal.record(
            Kind.PLACEMENT,
            f"{job.name}: had no spare: {job.spares[0]} taken as its spare",
            job=job.name,
            host=job.spares[0],
            data={"spares": job.spares, "change": "spare"},
        )
        self._send_newest(job.spares)
        return {"": job.spares[0]}

    def _choose(self, hosts: list[str], exclude: set[str], count: int) -> list[str]:
        """Up to ``count`` usable hosts not in ``exclude`` that no other job holds, best first
        (nearest the job's first host)."""
        job = self._live
        others = self._reserved()
        usable = {
            h for h in self._fleet.usable(exclude=exclude) if others.get(h) in (None, job.name)
        }
        return choose_spares(
            self._inv,
            job.name,
            hosts[0],
            usable=usable,
            reserved=others,
            priority=self._priorities(),
            count=count,
        ).spares
