"""The inventory: hosts grouped in regions, and the jobs to keep alive on them.

Its model (``model``), read from a file (``load``: decoded with msgspec, unknown keys refused
with a guess at what was meant, then ``checks``; a bad file is one ``ConfigError`` line naming
the file, key path and line), and changed only as ``edit`` does: the console never rewrites a
user's file (``append_host`` adds a table at the end, so comments survive).
"""

from console.inventory.edit import append_host, remove_host, with_host
from console.inventory.load import load
from console.inventory.model import (
    ETCD_ENDPOINT,
    ConsoleSettings,
    HealthThresholds,
    Host,
    HostName,
    Inventory,
    Job,
    Placement,
    ProvisionerSettings,
    Region,
    Seconds,
)

__all__ = [
    "ETCD_ENDPOINT",
    "ConsoleSettings",
    "HealthThresholds",
    "Host",
    "HostName",
    "Inventory",
    "Job",
    "Placement",
    "ProvisionerSettings",
    "Region",
    "Seconds",
    "append_host",
    "load",
    "remove_host",
    "with_host",
]
