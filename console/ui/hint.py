"""The Fleet view's one hint line for a newcomer: what to press on a demo fleet, and what to
watch. Plain text from the controller's state, free of Textual like ``view.py``."""

from __future__ import annotations

from console.controller import Controller
from console.reach.transport.local import LocalTransport
from console.states import HostState


def _local(ctl: Controller, host: str) -> bool:
    """A local demo host: a folder on this machine, which kill and revive pretend to lose."""
    rt = ctl.fleet.hosts.get(host)
    return rt is not None and isinstance(rt.transport, LocalTransport)


def demo_hint(ctl: Controller, *, kill_key: str, revive_key: str) -> str:
    """``K kills local-a: watch demo move to local-b`` while a job trains on a local host with
    a spare; ``r brings local-a back`` while a local host is down; else nothing (a real
    fleet, nothing to try). The host and spare are the job's own, else (not placed yet) the
    inventory's."""
    for name in sorted(ctl.jobs):
        sup = ctl.jobs[name]
        placement = ctl.inv.jobs[name].placement
        host, spares = (sup.host, sup.spares) if sup.host else (placement.host, placement.spares)
        spares = [s for s in spares if s != host]
        if sup.state.is_terminal() or host is None or not spares or not _local(ctl, host):
            continue
        if ctl.fleet.hosts[host].state is HostState.UP:
            return f"{kill_key} kills {host}: watch {name} move to {spares[0]}"
    down = [h for h, rt in sorted(ctl.fleet.hosts.items()) if rt.state is HostState.DOWN]
    for host in down:
        if _local(ctl, host):
            return f"{revive_key} brings {host} back"
    return ""
