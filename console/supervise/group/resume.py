"""The step a multi-host job's next epoch resumes from, and the promotion that lets new
members load it: a survivor loads its own checkpoints, a member new to its rank the replica of
that rank's shard on its host, promoted into its checkpoints folder first."""

from __future__ import annotations

import asyncio
import posixpath
from collections.abc import Awaitable, Callable

from console.fleet.hosts import Fleet
from console.inventory import Inventory
from console.reach.deploy import checkpoint_file, replica_dir
from console.reach.remote import list_manifests_in, promote
from console.reach.transport.base import PermanentTransportError, TransportError
from console.replication.replicator import Replicator, Source, rank_shard, shard_key
from console.supervise.group.commit import Commits
from console.supervise.incident import OpenIncident
from console.supervise.launcher import Launcher
from console.supervise.live import Alert
from protocol.spec import CheckpointManifest

Held = tuple[int, str, CheckpointManifest]
"""A step a host holds: the epoch it was written under, its folder there, its manifest."""
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
        ensure: Callable[[str], Awaitable[bool]],
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
        self._any_shard = inv.logical_ranks(name) is not None
        """Every member's shard holds the whole state (logical ranks: replicated model and
        optimizer, a global data position): any of them loads on any member."""
        self._shards = len(inv.members(name))
        """Node ranks the job can have (its planned size): the replica folders on a spare."""
        self._ensure = ensure
        """A job on one host: its newest whole checkpoint copied to a new host first, from
        wherever it is (``Targets.ensure_replica``): the host may have been no spare."""
        self._sharded = inv.multi_host(name)
        """A job on several hosts replicates each rank's shard to a folder of its own; a job on
        one host (a group of one) its whole checkpoint, in ``replicas/JOB``."""
        self._refused: set[tuple[str, int]] = set()
        """(host, step): a member on that host could not load that step (its executor said so,
        or its promotion failed); never chosen for that host again."""
        self._retried: set[tuple[str, int]] = set()
        """(host, step): refusals a restart was already granted for, free of the budget."""

    def refuse(self, host: str, step: int) -> None:
        """A member on ``host`` could not load ``step``: the next resume chooses an older one."""
        self._refused.add((host, step))

    def retry(self, host: str, step: int | None) -> bool:
        """A member on ``host`` could not load ``step``, the one its epoch was told to resume
        from (its run ended ``resume_failed``): that step is refused there (its ``Fault`` may
        never have been read), and True the first time for that host and step: the restart
        that follows resumes from an older step, so it spends none of the job's restarts and
        such restarts end. False when the step is not known (a run found at console start) or
        was retried already."""
        if step is None:
            return False
        key = (host, step)
        self.refuse(*key)
        if key in self._retried:
            return False
        self._retried.add(key)
        return True

    async def step(self, replaced: list[int], *, planned: bool = False) -> int | None:
        """The newest whole step every member can load (``planned``: once the shards of the
        members leaving, written at the stop, have reached the hosts taking their ranks), each
        from its own checkpoints or else from a replica on its host (promoted now). Whole:
        committed (every shard reported), or every member's shard of it on disk under one epoch
        (members that trained on while no console watched wrote steps none committed, and
        pruned the committed ones). None: no such step; the group starts from step 0.

        ``replaced``: the node ranks new to their host (a console that restarted mid-move may
        not know them; a replica is looked for on every member's host all the same)."""
        members = self._members()
        if planned:  # the leaving members' hosts are up: their last shards reach the spares
            for r in replaced:
                # interchangeable shards: rank 0's of the stop (every member's goes to every spare)
                shard = rank_shard(self._sharded, 0 if self._any_shard else r)
                await self._replicator.wait_idle(self._name, members[r], REPLICATE_WAIT_S, shard)
        if not self._sharded:
            for r in replaced:
                await self._ensure(members[r])
        committed = self._commits.steps()
        have = list(await asyncio.gather(*(self._shards_on(r, h) for r, h in enumerate(members))))
        for r, host in enumerate(members):
            for s in [s for s in have[r] if (host, s) in self._refused]:
                del have[r][s]
        step = _newest_whole(have, committed)
        if self._any_shard:
            # a member with no copy of the newest committed step some member wrote (a host that
            # was no spare) gets that member's shard of it: any shard loads on any member
            best = max(
                (s for s in committed if any(self._own(r, s, have) for r in range(len(have)))),
                default=None,
            )
            if best is not None and (step is None or best > step):
                src = next(r for r in range(len(have)) if self._own(r, best, have))
                await self._seed(best, members[src], have[src][best], have)
                step = _newest_whole(have, committed)
        while step is not None and not await self._promoted(step, have):
            step = _newest_whole(have, committed)  # one that failed is gone from ``have``
        if step is None:
            if committed:
                self._alert(
                    f"{self._name}: no committed step (newest {committed[0]}) is held by every "
                    "member: starting again from step 0",
                    job=self._name,
                )
            return None
        self._incident.phase("transfer_done", host=",".join(members), replica_step=step)
        return step

    async def _promoted(self, step: int, have: list[dict[int, Held]]) -> bool:
        """Promote ``step``'s replica for each member that does not hold it itself. False when
        one fails: that step is refused for its host (and dropped from ``have``)."""
        for r, host in enumerate(self._members()):
            if self._own(r, step, have):
                continue
            try:
                await promote(
                    self._fleet.hosts[host].transport,
                    self._inv.python(host),
                    have[r][step][1],
                    self._checkpoints(host),
                    step,
                )
            except PermanentTransportError as e:  # the replica itself will not do
                self._alert(
                    f"{self._name}: promoting shard {r} of step {step} on {host} failed: {e}; "
                    "choosing an older step",
                    job=self._name,
                )
                self.refuse(host, step)
                del have[r][step]
                return False
            except TransportError as e:  # the host: its start fails too, and is handled then
                self._alert(
                    f"{self._name}: promoting shard {r} on {host} failed: {e}", job=self._name
                )
        return True

    def _own(self, r: int, step: int, have: list[dict[int, Held]]) -> bool:
        """Does member ``r`` hold ``step`` in its own checkpoints (not only as a replica)?"""
        held = have[r].get(step)
        return held is not None and held[1] == self._checkpoints(self._members()[r])

    def _checkpoints(self, host: str) -> str:
        return posixpath.join(self._launcher.workdir(host), "checkpoints")

    async def _seed(self, step: int, source: str, held: Held, have: list[dict[int, Held]]) -> None:
        """Copy ``source``'s own shard of ``step`` to each member that lacks it (as a replica,
        verified there), noting it in ``have``."""
        members, manifest = self._members(), held[2]
        path = checkpoint_file(self._inv.host_root(source), self._name, step)
        for r, host in enumerate(members):
            if step in have[r] or (host, step) in self._refused:
                continue
            src = Source(
                source, path, manifest, shard=rank_shard(self._sharded, manifest.node_rank or 0)
            )
            if await self._replicator.copy(self._name, host, src):
                folder = self._replica_folder(host, manifest.node_rank or 0)
                have[r][step] = (held[0], folder, manifest)

    def _replica_folder(self, host: str, rank: int) -> str:
        return replica_dir(
            self._inv.host_root(host), shard_key(self._name, rank_shard(self._sharded, rank))
        )

    async def _shards_on(self, shard: int, host: str) -> dict[int, Held]:
        """Steps of ``shard`` that ``host`` holds complete, each with the epoch it was written
        under and the folder it is in: its own checkpoints first, then the replicas there of
        that shard (where shards are interchangeable, of any rank's)."""
        others = [k for k in range(self._shards) if k != shard] if self._any_shard else []
        folders = [self._checkpoints(host)]
        folders += [self._replica_folder(host, k) for k in [shard, *others]]
        try:
            listed = await list_manifests_in(
                self._fleet.hosts[host].transport, self._inv.python(host), folders
            )
        except TransportError:
            return {}
        found: dict[int, Held] = {}
        for folder in folders:  # in order: its own checkpoints first
            for m in listed[folder]:
                # a single host's executor wrote node rank None: a group of one's shard 0
                mine = (m.node_rank or 0) == shard and m.nnodes == len(self._members())
                if self._any_shard or mine:
                    found.setdefault(m.step, (m.epoch, folder, m))
        return found


def _newest_whole(have: list[dict[int, Held]], committed: list[int]) -> int | None:
    """The newest step every host holds that is whole: committed, or written under one epoch
    with a shard of every node rank of that epoch among them (members that trained on while no
    console watched). A step only the survivors of a shrunk group wrote is not whole: the lost
    member's shard of it may never have been written."""
    common = set.intersection(*(set(h) for h in have)) if have else set()

    def whole(step: int) -> bool:
        if step in committed:
            return True
        held = [h[step] for h in have]
        ranks = {m.node_rank or 0 for _, _, m in held}  # None: a single host's, shard 0 of 1
        return len({e for e, _, _ in held}) == 1 and ranks == set(range(held[0][2].nnodes))

    return max((s for s in common if whole(s)), default=None)
