"""Where a job goes when it leaves its host (an operator's choice, its spares, then the
nearest usable host), and the newest replica put there before it does.
"""

from __future__ import annotations

from collections.abc import Callable

from console.fleet.hosts import Fleet
from console.inventory import Inventory
from console.reach.deploy import replica_dir, replica_file
from console.reach.remote import list_manifests
from console.reach.transport.base import TransportError
from console.replication.replicator import Replicator, Source
from console.spares.placement import failover_target
from console.states import HostState
from console.supervise.live import LiveJob


class Targets:
    def __init__(
        self,
        live: LiveJob,
        *,
        inv: Inventory,
        fleet: Fleet,
        replicator: Replicator,
        reserved: Callable[[], dict[str, str]],
    ) -> None:
        self._live = live
        self._inv = inv
        self._fleet = fleet
        self._replicator = replicator
        self._reserved = reserved
        """Hosts other jobs hold as spares (host -> job)."""

    async def pick(
        self,
        old: str | None,
        *,
        back: bool = False,
        taken: frozenset[str] = frozenset(),
        first: tuple[str, ...] = (),
        to_target: bool = True,
    ) -> str | None:
        """The host the job goes to next, never ``old`` (the host it leaves) unless ``back``:
        ``old`` was lost, and once it is up and fit again it is a host like any other (a job
        whose only host rebooted, or whose failover target died as it started, goes back to it
        rather than wait for a host forever).

        One choice for a single host's job and each member a group replaces: an operator's
        target, else the job's spares (``first``, a group's readied hosts, before them), else
        the nearest usable host (``placement.failover_target``); never a host in ``taken``
        (a group's members, and the hosts already chosen for its other leaving members).
        ``to_target`` false: the operator's target is not this choice's (a group replacing
        several members at once)."""
        job, fleet = self._live, self._fleet
        avoid = taken | ({old} if old and not back else set())
        usable = fleet.usable(exclude=set(avoid)) | {
            h
            for h, rt in fleet.hosts.items()
            if rt.job == job.name and h not in avoid and fleet.fit(h)  # readied, and still fit
        }
        if job.target is not None and to_target:
            return job.target if job.target in usable else None
        home = self._inv.hosts[old].region if old else ""
        spares = [*first, *(s for s in job.spares if s not in first)]
        return failover_target(
            self._inv, home, spares=spares, usable=usable, reserved=self._reserved()
        )

    async def ensure_replica(self, target: str, own: Source | None) -> bool:
        """If ``target`` lacks the newest whole checkpoint another reachable host holds (``own``,
        the job's newest on the host that wrote or resumed it, first; then the replicas), copy
        it there first; False when that copy failed. A job on one host's (its checkpoints are
        whole): a failover to a host that was no spare resumed from step 0 without it."""
        job, fleet, inv, replicator = self._live, self._fleet, self._inv, self._replicator
        best: Source | None = None
        if (
            own is not None
            and own.host != target
            and fleet.hosts[own.host].state not in (HostState.DOWN, HostState.SUSPECT)
        ):
            best = own
        for (name, holder), st in replicator.state.items():
            m = st.manifest
            if (
                name == job.name
                and holder != target
                and m is not None
                and fleet.hosts[holder].state is not HostState.DOWN
                and (best is None or m.step > best.manifest.step)
            ):
                best = Source(holder, replica_file(inv.host_root(holder), job.name, m.step), m)
        if best is None:
            return True
        have = replicator.replica(job.name, target).manifest
        if have is None:
            try:
                found = await list_manifests(
                    fleet.hosts[target].transport,
                    inv.python(target),
                    replica_dir(inv.host_root(target), job.name),
                )
                have = found[-1] if found else None
            except TransportError:
                have = None
        if have is None or have.step < best.manifest.step:
            return await replicator.copy(job.name, target, best)
        return True
