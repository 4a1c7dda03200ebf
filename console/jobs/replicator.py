"""Replication: every checkpoint a primary saves is copied to the job's spares and verified there.

Copies stream host to host through the console (sha256 checked on the spare). A newer
checkpoint replaces one still waiting, so a slow link replicates the newest, not a backlog.
A replica is complete once its manifest is in place; the last ``replicas_kept`` are kept.

Before each copy the replicas it would retire go first (never the newest complete one), then
the spare's free space is measured: the copy must leave ``min_free_disk_gb``, and at least
room for one more checkpoint (a promoted spare writes its next one before pruning). Pruning
after the copy instead let a disk filled between a copy and its prune look healthy for ever:
each later copy fit in exactly the space the prune freed (chaos seed 11). A copy that does not
fit writes nothing and fails as the spare's disk being full; any failed copy leaves no partial
file behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import posixpath
import re
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import msgspec

from console import clock
from console.inventory import Inventory
from console.reach.deploy import replica_dir
from console.reach.transport.base import (
    DiskUsage,
    PermanentTransportError,
    Transport,
    TransportError,
)
from console.reach.transport.files import transfer
from console.records.incidents import IncidentLog
from console.records.journal import Journal, Kind
from protocol.spec import CheckpointManifest

CLEANUP_TIMEOUT_S = 10.0
"""Removing a failed copy's files; what is not removed then goes before the next copy."""
_NAME = re.compile(r"step-(\d{10})\.(pt|json)(\.part)?")


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


@dataclass(frozen=True)
class Source:
    host: str
    path: str
    manifest: CheckpointManifest


class SpareDiskFull(PermanentTransportError):
    """The replica would not fit on the spare with its reserve kept free; nothing was written."""

    def __init__(self, message: str) -> None:
        super().__init__(message, errno=errno.ENOSPC)


async def _once(data: bytes) -> AsyncIterator[bytes]:
    yield data


def _blocks(n: int, block: int) -> int:
    """Bytes a file of ``n`` bytes takes on disk: whole blocks."""
    return -(-n // block) * block


def _mb(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


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
    ) -> None:
        self._inv = inv
        self._transport = transport
        self._journal = journal
        self._incidents_log = incidents
        self._step_of = step_of
        self.state: dict[tuple[str, str], ReplicaState] = {}
        self._pending: dict[tuple[str, str], Source] = {}
        self._workers: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._idle: dict[tuple[str, str], asyncio.Event] = {}
        self._incidents: dict[tuple[str, str], int] = {}
        """Open incidents of spares that replicas fail to reach: (job, spare) -> incident."""
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}
        """One copy at a time into a spare's folder (the worker's and a failover's)."""

    def replica(self, job: str, spare: str) -> ReplicaState:
        return self.state.setdefault((job, spare), ReplicaState())

    def submit(self, job: str, spares: list[str], source: Source) -> None:
        for spare in spares:
            key = (job, spare)
            self._pending[key] = source
            self._idle.setdefault(key, asyncio.Event()).clear()
            worker = self._workers.get(key)
            if worker is None or worker.done():
                self._workers[key] = asyncio.create_task(
                    self._drain(key), name=f"replicate {job}->{spare}"
                )

    async def close(self) -> None:
        """Cancel copies in flight (a console closing): a replica is complete only once its
        manifest is in place, and a copy cut short is cleared by the next copy's survey."""
        workers = [w for w in self._workers.values() if not w.done()]
        for w in workers:
            w.cancel()
        await asyncio.gather(*workers, return_exceptions=True)

    async def wait_idle(self, job: str, spare: str, timeout: float) -> bool:
        """Wait until nothing for (job, spare) is queued or in flight."""
        event = self._idle.get((job, spare))
        if event is None:
            return True
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await event.wait()
                return True
        return False

    async def _drain(self, key: tuple[str, str]) -> None:
        try:
            while (source := self._pending.pop(key, None)) is not None:
                await self.copy(key[0], key[1], source)
        finally:
            self._idle.setdefault(key, asyncio.Event()).set()

    def folder_lock(self, job: str, spare: str) -> asyncio.Lock:
        """Held while a job's replica folder on a spare changes (a copy and its prune) or is
        read whole (a failover promoting it)."""
        return self._locks.setdefault((job, spare), asyncio.Lock())

    async def copy(self, job: str, spare: str, src: Source) -> bool:
        """One checkpoint to one spare; True when verified there. Failures are journalled, not raised."""
        async with self.folder_lock(job, spare):
            return await self._copy(job, spare, src)

    async def _copy(self, job: str, spare: str, src: Source) -> bool:
        st = self.replica(job, spare)
        if st.manifest is not None and st.manifest.step >= src.manifest.step:
            return True
        src_t = self._transport(src.host)
        dst_t = self._transport(spare)
        folder = replica_dir(self._inv.host_root(spare), job)
        step = src.manifest.step
        stem = posixpath.join(folder, f"step-{step:010d}")
        manifest = msgspec.json.encode(src.manifest)
        t0 = time.perf_counter()
        try:
            await dst_t.connect()
            await dst_t.makedirs(folder)
            older = await self._make_room(job, spare, dst_t, folder, src.manifest, len(manifest))
            result = await transfer(
                src_t, src.path, dst_t, stem + ".pt", sha256=src.manifest.sha256
            )
            await dst_t.write_chunks(stem + ".json.part", _once(manifest))
            await dst_t.rename(stem + ".json.part", stem + ".json")
        except TransportError as e:
            await self._discard(dst_t, stem)
            self._journal.record(
                Kind.REPLICA,
                f"{job}: replica of step {step} to {spare} failed: {e}",
                job=job,
                host=spare,
                data={"step": step, "ok": False, "error": str(e), "errno": e.errno},
            )
            st.full = e.disk_full
            self._failing(job, spare, e)
            return False
        st.manifest, st.at, st.full = src.manifest, clock.wall(), False
        stay = self._inv.console.replicas_kept - 1  # with this one, replicas_kept in all
        retire = older[: max(len(older) - stay, 0)]
        st.kept = [*older[len(retire) :], step]
        with contextlib.suppress(TransportError):
            await self._remove_steps(dst_t, folder, retire)
            self._measured(st, await dst_t.disk_usage(folder))
        self._journal.record(
            Kind.REPLICA,
            f"{job}: step {step} replicated to {spare} ({result.mb_per_s:.0f} MB/s)",
            job=job,
            host=spare,
            data={
                "step": step,
                "ok": True,
                "seconds": time.perf_counter() - t0,
                "bytes": src.manifest.size,
                "epoch": src.manifest.epoch,
                "free_bytes": st.disk.free if st.disk else None,
            },
        )
        self._recovered(job, spare, step)
        return True

    async def _make_room(
        self,
        job: str,
        spare: str,
        t: Transport,
        folder: str,
        m: CheckpointManifest,
        manifest_bytes: int,
    ) -> list[int]:
        """Retire what this copy would retire, drop leftovers, then check the copy fits with
        its reserve; the complete replicas older than it that stay, oldest first.

        Raises SpareDiskFull (writing nothing) when it does not fit."""
        complete, leftovers = _survey(await t.listdir(folder))
        older = [s for s in complete if s < m.step]
        keep = max(self._inv.console.replicas_kept - 1, 1)  # never the newest complete
        retire, older = older[:-keep], older[-keep:]
        for name in leftovers:
            await t.remove(posixpath.join(folder, name))
        await self._remove_steps(t, folder, retire)
        disk = await t.disk_usage(folder)
        self._measured(self.replica(job, spare), disk)
        need = _blocks(m.size, disk.block) + _blocks(manifest_bytes, disk.block)
        floor = int(self._inv.console.min_free_disk_gb * 2**30)
        reserve = max(floor, _blocks(m.size, disk.block))
        if disk.free < need + reserve:
            raise SpareDiskFull(
                f"{spare}: disk full: {_mb(disk.free)} free under {folder}; the replica of step "
                f"{m.step} needs {_mb(need)} and {_mb(reserve)} must stay free"
            )
        return older

    def _measured(self, st: ReplicaState, disk: DiskUsage) -> None:
        st.disk, st.disk_at = disk, clock.wall()

    async def _remove_steps(self, t: Transport, folder: str, steps: list[int]) -> None:
        for old in steps:
            stem = posixpath.join(folder, f"step-{old:010d}")
            await t.remove(stem + ".json")  # the manifest first: never a manifest without data
            await t.remove(stem + ".pt")

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


def _survey(names: list[str]) -> tuple[list[int], list[str]]:
    """Steps of the complete replicas in a folder (oldest first), and the leftovers of copies
    that did not finish (parts, data without its manifest, a manifest without its data)."""
    found: dict[int, set[str]] = {}
    for name in names:
        if (match := _NAME.fullmatch(name)) is not None:
            found.setdefault(int(match[1]), set()).add(name)
    complete, leftovers = [], []
    for step, have in sorted(found.items()):
        whole = {f"step-{step:010d}.pt", f"step-{step:010d}.json"}
        if whole <= have:
            complete.append(step)
        leftovers += sorted(have - whole if whole <= have else have)
    return complete, leftovers
