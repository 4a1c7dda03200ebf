"""Where the console's jobs meet the provisioner: a host is wanted only when no free host is
there to take; a made host is readied, added to the inventory and the fleet and remembered
as made; an idle made host is released (out of use for good before its release command runs, its
table out of the inventory after).
The provisioning itself (the command, its retries, the release loop) is
``console/fleet/provision.py``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable
from typing import Any

from console.fleet.hosts import Fleet
from console.fleet.provision import RELEASE_CHECK_S, Provisioner
from console.inventory import Inventory, ProvisionerSettings, remove_host, with_host
from console.reach.check import ready_host
from console.records.journal import Journal
from console.records.state_store import StateStore
from protocol.errors import ConfigError

HOST_WANTED_S = 15.0
"""A provision is retried while a job asked for a host this recently."""


class HostSupply:
    """Given the inventory (its ``hosts`` grow as hosts are added), the fleet, the state
    store, how to add a host (``Controller.add_host``), the hosts the jobs keep as spares,
    whether a job trains on or keeps a host, the journal and the alert sink."""

    def __init__(
        self,
        settings: ProvisionerSettings,
        *,
        inv: Inventory,
        fleet: Fleet,
        store: StateStore,
        add_host: Callable[[str, dict[str, Any]], None],
        reserved: Callable[[], set[str]],
        busy: Callable[[str], bool],
        journal: Journal,
        alert: Callable[..., None],
    ) -> None:
        self._inv = inv
        self._fleet = fleet
        self._store = store
        self._add_host = add_host
        self._reserved = reserved
        self._busy = busy
        self._alert = alert
        self._wanted_at = -math.inf
        """When a job last waited for a host (monotonic): a provision goes on while one does."""
        self.provisioner = Provisioner(
            settings,
            prepare=lambda name, table: ready_host(with_host(inv.path, name, table), name),
            add=self._add,
            known=lambda: set(inv.hosts),
            provisioned=self.made,
            wanted=lambda: time.monotonic() - self._wanted_at < HOST_WANTED_S,
            free_in=lambda region: sum(1 for h in fleet.usable() if inv.hosts[h].region == region),
            journal=journal,
            alert=alert,
        )

    def need(self, why: str) -> None:
        """A job needs a host (to move to, or as its spare): provision one, unless a free
        host is there to take (the spare keeper, a failover will)."""
        if self._fleet.usable(exclude=self._reserved()):
            return
        self._wanted_at = time.monotonic()
        self.provisioner.want(why)

    def made(self) -> dict[str, str]:
        """The provisioned hosts held (not released), with their regions."""
        return {
            h: host.region
            for h, host in self._inv.hosts.items()
            if self._store.host(h).provisioned and not self._store.host(h).released
        }

    async def keep(
        self, quiet: Callable[[str], Awaitable[None]], every_s: float = RELEASE_CHECK_S
    ) -> None:
        """``min_spares`` kept, idle made hosts released (``Provisioner.keep``); ``quiet``
        waits out what the console still runs on a host chosen for release."""
        await self.provisioner.keep(
            self._in_use,
            self._released,
            releasing=self._fleet.releasing,
            quiet=quiet,
            chosen=lambda h: self._fleet.hosts[h].releasing,
            every_s=every_s,
        )

    def _in_use(self, host: str) -> bool:
        """A job trains on it or keeps it as a spare, or a recovery readies it (a failover's
        target while the newest checkpoint is copied there)."""
        return self._busy(host) or host in self._fleet.readying

    async def close(self) -> None:
        await self.provisioner.close()

    def _add(self, name: str, table: dict[str, Any]) -> None:
        self._add_host(name, table)
        self._store.host(name).provisioned = True
        self._store.save()

    def _released(self, host: str) -> None:
        """Its release command ran: cordoned for good, out of the inventory file."""
        self._fleet.release(host)
        self._store.host(host).released = True
        self._store.save()
        try:
            remove_host(self._inv.path, host)
        except ConfigError as e:
            self._alert(f"{host} released, but its table stays in the inventory: {e}", host=host)
