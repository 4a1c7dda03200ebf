"""Work on a host that a recovery waits for (a copy to its target, an executor readied
there), given up as soon as the fleet finds that host down: a fault during the recovery must
not hold it up for the work's own timeouts (a frozen host answers nothing until then).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection
from typing import TypeVar

from console.fleet.hosts import Fleet
from console.records.journal import Journal, Kind
from console.states import HostState
from protocol.errors import HotspareError

T = TypeVar("T")

CHECK_S = 0.2
"""How often the host's state is looked at while the work runs."""


class HostLost(HotspareError):
    """The host was found down while the work ran; the work was cancelled."""

    permanent = False

    def __init__(self, host: str) -> None:
        super().__init__(f"{host} was found down")
        self.host = host


async def unless_down(
    fleet: Fleet,
    host: str | Collection[str] | Callable[[], str | None],
    work: Awaitable[T],
    every_s: float = CHECK_S,
) -> T:
    """``work``'s result; HostLost (``work`` cancelled) once ``host`` (each of several, or
    what ``host()`` says, None while not known) is found down. Meanwhile the host is in
    ``fleet.readying``, so the reachability check watches it even when a job has it."""
    task = asyncio.ensure_future(work)
    watched: set[str] = set()
    try:
        while not task.done():
            for name in _names(host):
                if name not in watched:
                    watched.add(name)
                    fleet.readying.add(name)
                if fleet.hosts[name].state is HostState.DOWN:
                    task.cancel()
                    await asyncio.gather(task, return_exceptions=True)
                    raise HostLost(name)
            await asyncio.wait({task}, timeout=every_s)
        return task.result()
    finally:
        fleet.readying -= watched
        if not task.done():  # this coroutine was cancelled itself
            task.cancel()


def _names(host: str | Collection[str] | Callable[[], str | None]) -> list[str]:
    if isinstance(host, str):
        return [host]
    if callable(host):
        name = host()
        return [] if name is None else [name]
    return list(host)


def given_up(journal: Journal, job: str, host: str) -> None:
    """Journal that the executor readied for ``job`` on ``host`` was given up: the host was
    found down while it started (one line, whichever supervisor readied it)."""
    journal.record(
        Kind.ACTION, f"{job}: {host} was lost while it was readied; not used", job=job, host=host
    )
