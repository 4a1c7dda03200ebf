"""Choosing hosts: a job's spares and where it fails over to.

Same region first, then the regions' failover priority, then host priority. A spare
reserved for a job goes to no lower-priority job; a higher-priority job may take it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from console.inventory import Inventory


def rank(inv: Inventory, home_region: str, hosts: Iterable[str]) -> list[str]:
    """Hosts in the order a job from ``home_region`` should try them."""

    def key(name: str) -> tuple[int, int, int, str]:
        host = inv.hosts[name]
        region = inv.regions[host.region]
        return (0 if host.region == home_region else 1, region.priority, host.priority, name)

    return sorted(hosts, key=key)


def failover_order(
    inv: Inventory,
    home_region: str,
    *,
    spares: list[str],
    usable: set[str],
    reserved: dict[str, str],
) -> list[str]:
    """Every usable host a job from ``home_region`` could move to, best first: its own spares
    (in their order), then free hosts ranked, then hosts other jobs hold as spares, ranked.
    A failover the console decides takes the first that is not another job's spare
    (``automatic``); an operator may pick any (the pick dialog lists them all)."""
    own = [s for s in spares if s in usable]
    rest = [h for h in usable if h not in own]
    return (
        own
        + rank(inv, home_region, [h for h in rest if h not in reserved])
        + rank(inv, home_region, [h for h in rest if h in reserved])
    )


def automatic(order: list[str], *, spares: list[str], reserved: dict[str, str]) -> str | None:
    """The host a failover the console decides goes to: the first of ``order`` that is the
    job's own spare or no other job's."""
    return next((h for h in order if h in spares or h not in reserved), None)


def failover_target(
    inv: Inventory,
    home_region: str,
    *,
    spares: list[str],
    usable: set[str],
    reserved: dict[str, str],
) -> str | None:
    """Where a failover the console decides goes, for a single host's job and a group's member
    alike: ``automatic`` over ``failover_order``."""
    order = failover_order(inv, home_region, spares=spares, usable=usable, reserved=reserved)
    return automatic(order, spares=spares, reserved=reserved)


@dataclass(frozen=True)
class Choice:
    spares: list[str]
    taken: list[tuple[str, str]]
    """(host, job) pairs: spares taken from a lower-priority job."""


def choose_spares(
    inv: Inventory,
    job: str,
    primary: str,
    *,
    usable: set[str],
    reserved: dict[str, str],
    priority: dict[str, int],
    count: int = 1,
) -> Choice:
    """Spares for ``job`` on ``primary``: its named spares first, then the best ranked usable hosts.

    ``usable`` are hosts that may take work (up, not cordoned or drained, not a primary);
    ``reserved`` maps a host to the job it is a spare for.
    """
    mine = priority.get(job, 0)
    home = inv.hosts[primary].region

    def available(h: str) -> bool:
        owner = reserved.get(h)
        return (
            h != primary
            and h in usable
            and (owner is None or owner == job or priority.get(owner, 0) < mine)
        )

    named = [h for h in inv.jobs[job].placement.spares if available(h)]
    others = rank(inv, home, [h for h in usable if available(h) and h not in named])
    picked = (named + others)[:count]
    taken = [(h, reserved[h]) for h in picked if reserved.get(h) not in (None, job)]
    return Choice(spares=picked, taken=taken)


def choose_primary(
    inv: Inventory,
    job: str,
    *,
    usable: set[str],
    reserved: dict[str, str],
    priority: dict[str, int],
) -> str | None:
    """Where a job starts: its named host if usable, else the best host in its region, else anywhere."""
    placement = inv.jobs[job].placement
    if placement.host and placement.host in usable:
        return placement.host
    mine = priority.get(job, 0)
    free = [
        h for h in usable if reserved.get(h) in (None, job) or priority.get(reserved[h], 0) < mine
    ]
    home = placement.region or (inv.hosts[placement.host].region if placement.host else None)
    primaries = [h for h in free if inv.hosts[h].role == "primary"]
    ordered = rank(inv, home or "", primaries or free)
    return ordered[0] if ordered else None
