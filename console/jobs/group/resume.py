"""The step a multi-host job's next epoch resumes from, and the promotion that lets new
members load it: a survivor loads its own checkpoints, a member new to its rank the replica of
that rank's shard on its host, promoted into its checkpoints folder first."""

from __future__ import annotations

import asyncio
import posixpath
from collections.abc import Callable

from console.fleet.hosts import Fleet
from console.inventory import Inventory
from console.jobs.group.commit import Commits
from console.jobs.incident import OpenIncident
from console.jobs.launcher import Launcher
from console.jobs.live import Alert
from console.jobs.replicator import Replicator, shard_key
from console.reach.deploy import replica_dir
from console.reach.remote import list_manifests, promote
from console.reach.transport.base import TransportError

REPLICATE_WAIT_S = 120.0
"""A planned move waits this long at most for the leaving members' last shards to reach the
hosts that take their ranks (0 lost steps), as a single host's does."""


class ResumeStep:
    """Finds the newest step every member can load, and promotes replicas for new members."""

    def __init__(
        self,
        name: str,
        *,
        commits: Commits,
        inv: Inventory,
        fleet: Fleet,
        launcher: Launcher,
        alert: Alert,
        incident: OpenIncident,
        members: Callable[[], list[str]],
        replicator: Replicator,
    ) -> None:
        self._name = name
        self._replicator = replicator
        self._commits = commits
        self._inv = inv
        self._fleet = fleet
        self._launcher = launcher
        self._alert = alert
        self._incident = incident
        self._members = members
        """The job's hosts now, by node rank."""

    async def step(self, replaced: list[int], *, planned: bool = False) -> int | None:
        """The newest whole step every member can load (``planned``: once the shards of the
        members leaving, written at the stop, have reached the hosts taking their ranks): a survivor from its own checkpoints, a
        new member from the replica of its shard on its host (promoted now). Whole: committed
        (every shard reported), or every member's shard of it on disk under one epoch (members
        that trained on while no console watched wrote steps none committed, and pruned the
        committed ones). None: no such step; the group starts from step 0."""
        members = self._members()
        if planned:  # the leaving members' hosts are up: their last shards reach the spares
            for r in replaced:
                await self._replicator.wait_idle(self._name, members[r], REPLICATE_WAIT_S, r)
        committed = self._commits.steps()
        have = await asyncio.gather(
            *(self._shards_on(r, h, r in replaced) for r, h in enumerate(members))
        )
        common = set.intersection(*(set(h) for h in have)) if have else set()
        whole = [s for s in common if s in committed or len({h[s] for h in have}) == 1]
        step = max(whole, default=None)
        if step is None:
            if committed:
                self._alert(
                    f"{self._name}: no committed step (newest {committed[0]}) is held by every "
                    "member: starting again from step 0",
                    job=self._name,
                )
            return None
        for r in replaced:
            host = members[r]
            try:
                await promote(
                    self._fleet.hosts[host].transport,
                    self._inv.python(host),
                    self._replica_folder(host, r),
                    posixpath.join(self._launcher.workdir(host), "checkpoints"),
                    step,
                )
            except TransportError as e:
                self._alert(
                    f"{self._name}: promoting shard {r} on {host} failed: {e}", job=self._name
                )
        self._incident.phase("transfer_done", host=",".join(members), replica_step=step)
        return step

    def _replica_folder(self, host: str, shard: int) -> str:
        return replica_dir(self._inv.host_root(host), shard_key(self._name, shard))

    async def _shards_on(self, shard: int, host: str, replica: bool) -> dict[int, int]:
        """Steps of ``shard`` that ``host`` holds complete (replicas, or its own checkpoints),
        each with the epoch it was written under."""
        folder = (
            self._replica_folder(host, shard)
            if replica
            else posixpath.join(self._launcher.workdir(host), "checkpoints")
        )
        try:
            found = await list_manifests(
                self._fleet.hosts[host].transport, self._inv.python(host), folder
            )
        except TransportError:
            return {}
        return {
            m.step: m.epoch
            for m in found
            if m.node_rank == shard and m.nnodes == len(self._members())
        }
