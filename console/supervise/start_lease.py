"""A Start's first lease, granted on a clock reading taken now and not sent half spent: one path
for a single host's executor and each member of a group (issue 30).

A grant that took half a lease itself (the state's write on a slow disk: the reading it was
anchored to was fresh, the lease it bounds is then half spent) is made again on a new reading,
up to ``REGRANTS`` times, then sent as it is. A group's Starts had no such rule: a member whose
grant stalled got a lease already over at its Start, stopped at once, and took its epoch with
it (test_start_anchor).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from console import clock
from console.fleet.link import ExecutorLink
from console.records.journal import Journal, Kind
from protocol.messages import Start

REGRANTS = 3
"""How many times a Start's lease found half spent by its own grant is granted afresh."""


async def granted_start(
    link: ExecutorLink,
    host: str,
    *,
    job: str,
    ttl_s: float,
    reading: Callable[[ExecutorLink], Awaitable[ExecutorLink]],
    grant: Callable[[ExecutorLink], Start],
    journal: Journal,
) -> tuple[ExecutorLink, Start]:
    """The link to the executor on ``host`` (``link``, or a new one to the same executor) and
    its Start, granted by ``grant`` (which persists the bound first and may raise). ``reading``
    gives a link holding a clock reading taken now (a Ping answered, or a new link's Hello)."""
    regrants = 0
    while True:
        link = await reading(link)
        used = link.anchor
        start = grant(link)
        spent = clock.mono() - used[1] if used is not None else 0.0
        if spent <= ttl_s / 2 or regrants >= REGRANTS:
            return link, start
        regrants += 1
        journal.record(
            Kind.ACTION,
            f"{job}: the Start's lease on {host} was {spent:.2f} s spent when granted "
            f"(of {ttl_s:g} s): granted again on a new reading",
            job=job,
            host=host,
            data={"spent_s": round(spent, 3), "regrant": regrants},
        )
