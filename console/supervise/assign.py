"""Where a job trains now, and its spares: one rule for one host and a group alike (issue 30:
a single host's job chose its spares afresh at each launch, dropping a spare that held its
replicas for another ranked higher; a group kept its spares, and chose only once none was
left)."""

from __future__ import annotations

from collections.abc import Callable

from console.fleet.hosts import Fleet
from console.inventory import Inventory
from console.records.journal import Journal, Kind
from console.spares.placement import choose_spares
from console.supervise.live import Alert, LiveJob
from console.supervise.services import TakeSpare


class Assignment:
    """Given the job's live view, the inventory and fleet, the fleet-wide choices it may use
    (hosts reserved for other jobs, their priorities, taking another job's spare, asking for a
    host), the state's save, the journal and the alert."""

    def __init__(
        self,
        live: LiveJob,
        *,
        inv: Inventory,
        fleet: Fleet,
        reserved: Callable[[], dict[str, str]],
        priorities: Callable[[], dict[str, int]],
        take_spare: TakeSpare,
        need_host: Callable[[str], None],
        save: Callable[[], object],
        journal: Journal,
        alert: Alert,
    ) -> None:
        self._live = live
        self._inv = inv
        self._fleet = fleet
        self._reserved = reserved
        self._priorities = priorities
        self._take_spare = take_spare
        self._need_host = need_host
        self._save = save
        self._journal = journal
        self._alert = alert
        self._said: tuple[tuple[str, ...], tuple[str, ...]] | None = None
        """The hosts and spares last journalled: said once, not at each launch."""

    def members(self, plan: list[str]) -> None:
        """The job's members are ``plan``, by node rank (its record names them), placed."""
        self._live.rec.members = list(plan)
        self.place(plan)

    def place(self, hosts: list[str]) -> None:
        """The job trains on ``hosts`` now (one, or a group's members by node rank): they are
        its and the hosts it left are free. Its spares are kept where still fit and free (they
        hold its replicas), and filled up to the count it asks for (its named spares first,
        then the nearest: ``choose_spares``); journalled, alerted when it has none."""
        job, fleet, name = self._live, self._fleet, self._live.name
        for h, rt in fleet.hosts.items():
            if rt.job == name and h not in hosts:
                fleet.free(h, name, f"{name} left it")
        for h in hosts:
            fleet.hosts[h].job = name
        job.host = hosts[0]
        wanted = max(1, len(self._inv.jobs[name].placement.spares))
        usable = fleet.usable()  # fit and free: never one of ``hosts``, taken just above
        kept = [s for s in job.spares if s in usable][:wanted]
        if len(kept) < wanted:
            choice = choose_spares(
                self._inv,
                name,
                hosts[0],
                usable=usable - set(kept),
                reserved=self._reserved(),
                priority=self._priorities(),
                count=wanted - len(kept),
            )
            for spare, other in choice.taken:
                self._take_spare(spare, other, by=name)
            kept += choice.spares
        job.spares = kept
        job.rec.host, job.rec.spares = hosts[0], list(kept)
        self._save()
        said = (tuple(hosts), tuple(kept))
        if said == self._said:  # the launch after a recovery's move: said then
            return
        self._said = said
        ranks = f" (node ranks 0..{len(hosts) - 1})" if len(hosts) > 1 else ""
        self._journal.record(
            Kind.PLACEMENT,
            f"{name}: on {', '.join(hosts)}{ranks}, spares {', '.join(kept) or 'none'}",
            job=name,
            host=hosts[0],
            data={"members": list(hosts), "spares": list(kept)},
        )
        if not kept:
            self._alert(f"job {name} has no spare: a host failure will wait for one", job=name)
            self._need_host(f"job {name} has no spare")
