"""Replication: every checkpoint a primary saves is copied to the job's spares and verified there.

Copies stream host to host through the console (sha256 checked on the spare); over SSH the
spare's whole side of a copy is one program on one channel (``console/replication/replica.py``), so
a small checkpoint costs a round trip, not a dozen remote commands. A newer
checkpoint replaces one still waiting, so a slow link replicates the newest, not a backlog.
A replica is complete once its manifest is in place; the last ``replicas_kept`` are kept.
A folder checkpoint (torch.distributed.checkpoint's) is replicated as a folder, every file
verified by the sha256 its manifest lists.

Before each copy the replicas it would retire go first (never the newest complete one), then
the spare's free space is measured: the copy must leave ``min_free_disk_gb``, and at least
room for one more checkpoint (a promoted spare writes its next one before pruning). Pruning
after the copy instead let a disk filled between a copy and its prune look healthy for ever:
each later copy fit in exactly the space the prune freed (chaos seed 11). A copy that does not
fit writes nothing and fails as the spare's disk being full; any failed copy leaves no partial
file behind. A replica's lag (journal ``lag_s``) runs from its CheckpointSaved reaching the
console to the copy verified on the spare.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec

from console import clock
from console.inventory import Inventory
from console.reach.deploy import replica_dir
from console.reach.remote import list_manifests
from console.reach.transport.base import DiskUsage, Transport, TransportError
from console.records.incidents import IncidentLog
from console.records.journal import Journal, Kind
from console.replication.direct import DirectReplication
from console.replication.replica import Received, ReplicaPlan, UnsafeManifest, folder_files, receive
from protocol.spec import CheckpointManifest

CLEANUP_TIMEOUT_S = 10.0
SETTLE_S = 60.0
SETTLE_POLL_S = 0.5
"""How often a settling console asks again whether a spare still copying answers."""
"""How long copies still under way are waited for once every job has ended."""
"""Removing a failed copy's files; what is not removed then goes before the next copy."""


@dataclass
class ReplicaState:
    manifest: CheckpointManifest | None = None
    at: float = 0.0
    """Wall time the newest replica was verified."""
    kept: list[int] = field(default_factory=list)
    """Steps of the complete replicas on the spare, as last seen."""
    disk: DiskUsage | None = None
    """The spare's disk under its replicas, as last measured."""
    disk_at: float = 0.0
    """Wall time ``disk`` was measured."""
    full: bool = False
    """The last copy failed for want of space on the spare."""
    lag_s: float | None = None
    """Seconds from the newest replica's CheckpointSaved reaching the console to its copy
    verified here (None when the copy was not of a reported checkpoint)."""


@dataclass(frozen=True)
class Source:
    host: str
    path: str
    manifest: CheckpointManifest
    shard: int | None = None
    """A multi-host job's shard (the node rank that wrote it): replicas of each shard keep a
    folder of their own on the spare (``replicas/JOB/node-R``)."""


def rank_shard(sharded: bool, rank: int) -> int | None:
    """What node rank ``rank``'s checkpoints replicate as: its own shard for a job on several
    hosts (``replicas/JOB/node-R``), whole (None) for a job on one host (``replicas/JOB``)."""
    return rank if sharded else None


def shard_key(job: str, shard: int | None) -> str:
    """The name a job's shard replicates under (its folder below ``replicas/``)."""
    return job if shard is None else f"{job}/node-{shard}"


class Replicator:
    """Given what it needs (the inventory's paths and settings, the hosts' transports, the
    journal and incident log, each job's current step), not the controller."""

    def __init__(
        self,
        inv: Inventory,
        *,
        transport: Callable[[str], Transport],
        journal: Journal,
        incidents: IncidentLog,
        step_of: Callable[[str], int | None],
        read_only: bool = False,
    ) -> None:
        self._inv = inv
        self._read_only = read_only
        """A read-only console copies nothing: it reads what the spares hold (``_look``)."""
        self._transport = transport
        self._journal = journal
        self._incidents_log = incidents
        self._step_of = step_of
        self.state: dict[tuple[str, str], ReplicaState] = {}
        self._pending: dict[tuple[str, str], tuple[Source, float]] = {}
        """What each spare copies next, and when its CheckpointSaved reached the console."""
        self._workers: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._idle: dict[tuple[str, str], asyncio.Event] = {}
        self._incidents: dict[tuple[str, str], int] = {}
        """Open incidents of spares that replicas fail to reach: (job, spare) -> incident."""
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}
        """One copy at a time into a spare's folder (the worker's and a failover's)."""
        self._direct = DirectReplication(inv, transport, journal)

    def replica(self, job: str, spare: str, shard: int | None = None) -> ReplicaState:
        return self.state.setdefault((shard_key(job, shard), spare), ReplicaState())

    def submit(
        self, job: str, spares: list[str], source: Source, saved_at: float | None = None
    ) -> None:
        """Replicate a checkpoint to each spare. ``saved_at``: when its CheckpointSaved
        reached the console (``clock.mono()``; default now), where a replica's lag starts."""
        saved_at = clock.mono() if saved_at is None else saved_at
        for spare in spares:
            key = (shard_key(job, source.shard), spare)
            self._pending[key] = (source, saved_at)
            self._idle.setdefault(key, asyncio.Event()).clear()
            worker = self._workers.get(key)
            if worker is None or worker.done():
                self._workers[key] = asyncio.create_task(
                    self._drain(job, key), name=f"replicate {key[0]}->{spare}"
                )

    async def close(self) -> None:
        """Cancel copies in flight (a console closing): a replica is complete only once its
        manifest is in place, and a copy cut short is cleared by the next copy's survey."""
        workers = [w for w in self._workers.values() if not w.done()]
        for w in workers:
            w.cancel()
        await asyncio.gather(*workers, return_exceptions=True)

    async def wait_idle(
        self, job: str, spare: str, timeout: float, shard: int | None = None
    ) -> bool:
        """Wait until nothing for (job, spare) is queued or in flight."""
        event = self._idle.get((shard_key(job, shard), spare))
        if event is None:
            return True
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await event.wait()
                return True
        return False

    async def _drain(self, job: str, key: tuple[str, str]) -> None:
        try:
            while (pending := self._pending.pop(key, None)) is not None:
                await self.copy(job, key[1], *pending)
        finally:
            self._idle.setdefault(key, asyncio.Event()).set()

    def folder_lock(self, job: str, spare: str, shard: int | None = None) -> asyncio.Lock:
        """Held while a job's replica folder on a spare changes (a copy and its prune) or is
        read whole (a failover promoting it)."""
        return self._locks.setdefault((shard_key(job, shard), spare), asyncio.Lock())

    async def copy(self, job: str, spare: str, src: Source, saved_at: float | None = None) -> bool:
        """One checkpoint to one spare; True when verified there. Failures are journalled, not
        raised. ``saved_at`` (``clock.mono()``): when the checkpoint was reported, for the lag."""
        async with self.folder_lock(job, spare, src.shard):
            if self._read_only:
                return await self._look(job, spare, src.shard)
            return await self._copy(job, spare, src, saved_at)

    async def look(self, job: str, spares: list[str], shards: list[int | None]) -> None:
        """A read-only console's first sight of a job's replicas: what each spare holds now
        (the owning console's copies), before any checkpoint is heard of."""
        for spare in spares:
            for shard in shards:
                async with self.folder_lock(job, spare, shard):
                    await self._look(job, spare, shard)

    async def _look(self, job: str, spare: str, shard: int | None) -> bool:
        """What a read-only console does instead of a copy: list the spare's replicas (the
        owning console's copies) and show the newest, as seen now. True when there is one."""
        st = self.replica(job, spare, shard)
        folder = replica_dir(self._inv.host_root(spare), shard_key(job, shard))
        try:
            found = await list_manifests(self._transport(spare), self._inv.python(spare), folder)
        except TransportError:
            return False
        if found:
            if st.manifest is None or st.manifest.step != found[-1].step:
                st.manifest, st.at, st.lag_s = found[-1], clock.wall(), None
            st.kept = [m.step for m in found]
        return bool(found)

    async def _copy(self, job: str, spare: str, src: Source, saved_at: float | None) -> bool:
        st = self.replica(job, spare, src.shard)
        if st.manifest is not None and st.manifest.step >= src.manifest.step:
            return True
        dst_t = self._transport(spare)
        step = src.manifest.step
        plan = ReplicaPlan(
            host=spare,
            folder=replica_dir(self._inv.host_root(spare), shard_key(job, src.shard)),
            step=step,
            size=src.manifest.size,
            sha256=src.manifest.sha256,
            manifest=msgspec.json.encode(src.manifest),
            replicas_kept=self._inv.console.replicas_kept,
            floor=int(self._inv.console.min_free_disk_gb * 2**30),
            python=self._inv.python(spare),
            files=folder_files(src.manifest),
        )
        t0 = time.perf_counter()
        try:
            got, route = await self._receive(job, spare, src, plan, st)
        except TransportError as e:
            if not isinstance(e, UnsafeManifest):  # that one was refused before any write
                await self._discard(dst_t, plan.stem)
            self._journal.record(
                Kind.REPLICA,
                f"{job}: replica of step {step} to {spare} failed: {e}",
                job=job,
                host=spare,
                data={
                    "step": step,
                    "ok": False,
                    "error": str(e),
                    "errno": e.errno,
                    "shard": src.shard,
                },
            )
            st.full = e.disk_full
            self._failing(job, spare, e)
            return False
        seconds = time.perf_counter() - t0
        lag = None if saved_at is None else clock.mono() - saved_at
        st.manifest, st.at, st.full, st.lag_s = src.manifest, clock.wall(), False, lag
        st.kept = [*got.older, step]
        rate = src.manifest.size / 1e6 / seconds if seconds > 0 else 0.0
        self._journal.record(
            Kind.REPLICA,
            f"{job}: step {step} replicated to {spare} ({rate:.0f} MB/s)",
            job=job,
            host=spare,
            data={
                "step": step,
                "ok": True,
                "seconds": seconds,
                "lag_s": lag,
                "bytes": src.manifest.size,
                "epoch": src.manifest.epoch,
                "free_bytes": st.disk.free if st.disk else None,
                "shard": src.shard,
                "route": route,
            },
        )
        self._recovered(job, spare, step)
        return True

    async def _receive(
        self, job: str, spare: str, src: Source, plan: ReplicaPlan, st: ReplicaState
    ) -> tuple[Received, str]:
        """Host to host where the pair can (``console/replication/direct.py``), else relayed
        through the console; the copy and which way it went."""

        def measured(disk: DiskUsage) -> None:
            self._measured(st, disk)

        got = await self._direct.copy(job, spare, src.host, src.path, plan, measured)
        if got is not None:
            return got, "direct"
        relayed = await receive(
            self._transport(spare), plan, self._transport(src.host), src.path, measured
        )
        return relayed, "relay"

    async def job_ended(self, job: str, timeout: float = 60.0) -> None:
        """A job that ended keeps its replicas, not the keys that copied them; its copies
        still under way finish first (for at most ``timeout``)."""
        if not self._direct.has_keys(job):
            return
        ours = [e for (key, _), e in self._idle.items() if key.split("/")[0] == job]
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                for event in ours:
                    await event.wait()
        await self._direct.revoke(job)

    async def settle(
        self, timeout: float = SETTLE_S, *, unreachable: Callable[[str], bool] = lambda h: False
    ) -> None:
        """Every copy still under way finishes (for at most ``timeout``): a console whose jobs
        all ended waits for them before it closes, so a job's last checkpoint reaches its
        spares before ``hotspare run`` exits (the close cut them: a group's last step never
        reached its spare). A copy to a spare that does not answer (``unreachable``: as the
        host monitor reads it now, or once it does while the console waits) is not waited
        for: ``hotspare run`` waited out the whole minute for it. What is still copying then
        is journalled as cut."""
        waiting = [(key, event) for key, event in self._idle.items() if not event.is_set()]
        deadline = time.monotonic() + timeout
        while waiting:
            still = []
            for (key, spare), event in waiting:
                if event.is_set():
                    continue
                if unreachable(spare):
                    self._cut(key, spare, f"{spare} does not answer, so it was not waited for")
                else:
                    still.append(((key, spare), event))
            waiting, left = still, deadline - time.monotonic()
            if not waiting or left <= 0:
                break
            ends = [asyncio.ensure_future(e.wait()) for _, e in waiting]
            try:
                await asyncio.wait(
                    ends, timeout=min(SETTLE_POLL_S, left), return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                for end in ends:
                    end.cancel()
        for (key, spare), _ in waiting:
            self._cut(key, spare, f"it was still under way {timeout:g} s after every job ended")

    def _cut(self, key: str, spare: str, why: str) -> None:
        job = key.split("/")[0]
        self._journal.record(
            Kind.REPLICA,
            f"{job}: the copy to {spare} is cut by the console's close: {why} (the replicas "
            "before stay)",
            job=job,
            host=spare,
        )

    def _measured(self, st: ReplicaState, disk: DiskUsage) -> None:
        st.disk, st.disk_at = disk, clock.wall()

    async def _discard(self, t: Transport, stem: str) -> None:
        """A failed copy's files on the spare: its parts, and data whose manifest never came.
        A spare out of reach keeps them until the next copy's survey removes them."""
        with contextlib.suppress(TransportError, TimeoutError):
            async with asyncio.timeout(CLEANUP_TIMEOUT_S):
                if await t.stat(stem + ".json") is None:
                    await t.remove(stem + ".pt", timeout=CLEANUP_TIMEOUT_S)
                for part in (".pt.part", ".json.part"):
                    await t.remove(stem + part, timeout=CLEANUP_TIMEOUT_S)

    def _failing(self, job: str, spare: str, error: TransportError) -> None:
        """A spare whose disk is full is an incident until a replica reaches it again: nothing
        is lost yet, but a failover would lose more."""
        if not error.disk_full or (job, spare) in self._incidents:
            return  # other failures (a source or spare gone) are the host's incident
        step = self._step_of(job) or 0
        n = self._incidents_log.open(
            job,
            spare,
            "disk_full",
            fault_at=clock.wall(),
            last_step=step,
            msg=f"replicas to {spare} fail: {error}",
        )
        self._incidents_log.phase(n, job, "decided", action="retry with the next checkpoint")
        self._incidents[(job, spare)] = n

    def _recovered(self, job: str, spare: str, step: int) -> None:
        n = self._incidents.pop((job, spare), None)
        if n is None:
            return
        last = self._step_of(job) or step
        self._incidents_log.phase(n, job, "transfer_done", step=step)
        self._incidents_log.phase(n, job, "loaded", step=last)  # training never stopped
        self._incidents_log.phase(n, job, "first_step", step=last)
