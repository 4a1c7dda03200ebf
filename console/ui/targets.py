"""Where a job could move, as the console's own failover would order it: the pick dialog's
list, the palette's ``fail over JOB to HOST`` entries, and the question ``f`` asks."""

from __future__ import annotations

from console.controller import Controller
from console.spares.placement import automatic, failover_order
from console.supervise.orders import ON_ITS_WAY


def failover_targets(ctl: Controller, job: str) -> list[tuple[str, str]]:
    """Hosts ``job`` could move to now, best first, in the order the console's own failover
    tries them (``failover_order``): its spares (with their replica), then free hosts by
    region and priority, then other jobs' spares; each with a one-line description."""
    sup = ctl.jobs[job]
    usable = ctl.fleet.usable(exclude={sup.host} if sup.host else None)
    reserved = ctl.reserved(job)
    region = ctl.inv.hosts[sup.host].region if sup.host else ""
    order = failover_order(ctl.inv, region, spares=sup.spares, usable=usable, reserved=reserved)
    out = []
    for name in order:
        h = ctl.inv.hosts[name]
        what = [h.region]
        if name in sup.spares:
            rep = ctl.replicator.replica(job, name).manifest
            what.append(f"its spare, replica @{rep.step}" if rep else "its spare, no replica yet")
        elif name in reserved:
            what.append(f"spare of {reserved[name]}")
        else:
            what.append(h.role)  # the inventory's: a free spare of no job, or a primary
        out.append((name, ", ".join(what)))
    return out


def failover_confirm(ctl: Controller, job: str) -> str:
    """The question before ``f``: it names the host the failover would go to now."""
    sup = ctl.jobs[job]
    targets = failover_targets(ctl, job)
    best = automatic([name for name, _ in targets], spares=sup.spares, reserved=ctl.reserved(job))
    if best is None:
        return f"Fail {job} over? No host can take it now: it waits for one."
    what = dict(targets)[best]
    if sup.state in ON_ITS_WAY:  # kept by the controller until the job trains (Orders)
        return f"Fail {job} over to {best} ({what}) once it trains? It is {sup.state.value}."
    return f"Fail {job} over to {best} ({what}) now?"
