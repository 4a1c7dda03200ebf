"""Where a job's first epoch under this console starts: a member host that may take no job
gives its rank to another; a job declared by region alone starts on the best usable host."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

from console.fleet.hosts import PROBE_RULE, Fleet
from console.inventory import Inventory
from console.records.journal import Journal, Kind
from console.spares.placement import choose_primary
from console.states import HostState


class Replacements(Protocol):
    def __call__(
        self, leaving: list[str], *, survivors: int, waits: str | None = None
    ) -> Awaitable[list[str | None] | None]: ...


class FirstPlacement:
    """Given the job's name and members now, the inventory and fleet, the fleet-wide choices
    (reserved hosts, priorities), the recovery's choice of replacements (``targets``), the
    members' assignment, an operator's stop honoured before a start, the job's waiting note,
    the wait for hosts, and the journal."""

    def __init__(
        self,
        name: str,
        *,
        members: Callable[[], list[str]],
        inv: Inventory,
        fleet: Fleet,
        reserved: Callable[[], dict[str, str]],
        priorities: Callable[[], dict[str, int]],
        targets: Replacements,
        assign: Callable[[list[str]], None],
        stop_before_start: Callable[[], bool],
        wait_note: Callable[[str], None],
        wait_for_hosts: Callable[[], Awaitable[None]],
        journal: Journal,
    ) -> None:
        self._name = name
        self._members = members
        self._inv = inv
        self._fleet = fleet
        self._reserved = reserved
        self._priorities = priorities
        self._targets = targets
        self._assign = assign
        self._stop_before_start = stop_before_start
        self._wait_note = wait_note
        self._wait_for_hosts = wait_for_hosts
        self._journal = journal

    async def place(self) -> list[int] | None:
        """Before this console's first epoch of the job: a member host that may take no job
        (cordoned, draining or drained by an operator, being released, failing a health rule)
        gives its rank to another, chosen as a failover's replacement is
        (``GroupRecovery.targets``: readied hosts, the spares, the nearest usable host) and
        waited for while there is none, as a single host's job is placed only on a usable
        host. The group started on a cordoned or drained member host. A host down or not
        yet heard is not judged here: its deploy fails and the recovery replaces it (under a
        policy that asks, once approved). The node ranks given to another host (each resumes
        from what that host holds of the job: its replica); None: the job was stopped while it
        waited.

        A job declared by its region alone (no ``host``) starts on the best usable host for
        it (``choose_primary``: its region's first, a lower-priority job's spare if need be)."""
        if not self._members():
            host = await self._primary()
            if host is None:
                return None
            self._assign([host])
            return []
        plan = list(self._members())
        why = {h: self._may_not_start_on(h) for h in plan}
        out = [h for h in plan if why[h] is not None]
        if not out:
            return []
        ranks = ", ".join(f"{h} ({why[h]})" for h in out)
        targets = await self._targets(
            out,
            survivors=len(plan) - len(out),
            waits=f"no usable host for {self._name} in place of {ranks}: it waits for a host",
        )
        if targets is None:
            return None
        for old, new in zip(out, targets, strict=True):
            self._journal.record(
                Kind.PLACEMENT,
                f"{self._name}: {old} {why[old]}: its rank starts "
                + (f"on {new}" if new else "nowhere (the group shrinks)"),
                job=self._name,
                host=old,
                data={"from": old, "to": new, "change": "member"},
            )
        moved = dict(
            zip(out, targets, strict=True)
        )  # the hosts left are freed (``Assignment.place``)
        self._assign([h for h in (moved.get(h, h) for h in plan) if h is not None])
        return [r for r, h in enumerate(self._members()) if h not in plan]

    async def _primary(self) -> str | None:
        """The host a job declared by region starts on, waited for while there is none; None:
        it was stopped meanwhile."""
        while True:
            host = choose_primary(
                self._inv,
                self._name,
                usable=self._fleet.usable(),
                reserved=self._reserved(),
                priority=self._priorities(),
            )
            if host is not None:
                return host
            if self._stop_before_start():  # an operator's stop while it waited: honoured
                return None
            self._wait_note(f"no usable host for {self._name}: it waits for a host")
            await self._wait_for_hosts()

    def _may_not_start_on(self, host: str) -> str | None:
        rt = self._fleet.hosts[host]
        if rt.state in (HostState.CORDONED, HostState.DRAINING, HostState.DRAINED):
            return f"is {rt.state.value}"
        if rt.leaving:
            return "is being released"
        # a host the probe cannot reach is judged by its deploy (a fault, not an unfit host):
        # the probe's finding may come before the host reads down
        failing = [f for f in self._fleet.failing(host) if f.rule != PROBE_RULE]
        return f"fails a health rule ({failing[0].message})" if failing else None
