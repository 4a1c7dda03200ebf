"""The transport for an inventory host."""

from __future__ import annotations

import os

from console.inventory import Inventory
from console.reach.transport.base import Transport
from console.reach.transport.local import LocalTransport


def open_transport(inv: Inventory, name: str) -> Transport:
    """A (not yet connected) transport to host ``name``."""
    host = inv.hosts[name]
    settings = inv.console
    if host.transport == "local":
        return LocalTransport(
            name, default_timeout=settings.command_timeout_s, root=inv.host_root(name)
        )
    from console.reach.transport.ssh import SshTarget, SshTransport

    def expand(p: str | None) -> str | None:
        return os.path.expanduser(p) if p else None

    return SshTransport(
        SshTarget(
            name=name,
            addresses=host.all_addresses(),
            port=host.port,
            user=host.user,
            identity=expand(host.identity),
            known_hosts=expand(host.known_hosts),
            proxy_jump=host.proxy_jump,
            connect_timeout=settings.connect_timeout_s,
            keepalive_s=settings.keepalive_s,
            command_timeout=settings.command_timeout_s,
        )
    )
