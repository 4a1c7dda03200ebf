"""Replication: every checkpoint a primary saves is copied to the job's spares and verified there.

Copies stream host to host through the console (sha256 checked on the spare). A newer
checkpoint replaces one still waiting, so a slow link replicates the newest, not a backlog.
A replica is complete once its manifest is in place; the last ``replicas_kept`` are kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import posixpath
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import msgspec

from console.reach.deploy import replica_dir
from console.reach.transport.base import TransportError
from console.reach.transport.files import transfer
from console.records.journal import Kind
from protocol.spec import CheckpointManifest

if TYPE_CHECKING:
    from console.jobs.controller import Controller


@dataclass
class ReplicaState:
    manifest: CheckpointManifest | None = None
    at: float = 0.0
    """Wall time the newest replica was verified."""
    kept: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class Source:
    host: str
    path: str
    manifest: CheckpointManifest


async def _once(data: bytes) -> AsyncIterator[bytes]:
    yield data


class Replicator:
    def __init__(self, ctl: Controller) -> None:
        self.ctl = ctl
        self.state: dict[tuple[str, str], ReplicaState] = {}
        self._pending: dict[tuple[str, str], Source] = {}
        self._workers: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._idle: dict[tuple[str, str], asyncio.Event] = {}
        self._incidents: dict[tuple[str, str], int] = {}
        """Open incidents of spares that replicas fail to reach: (job, spare) -> incident."""

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

    async def copy(self, job: str, spare: str, src: Source) -> bool:
        """One checkpoint to one spare; True when verified there. Failures are journalled, not raised."""
        ctl = self.ctl
        st = self.replica(job, spare)
        if st.manifest is not None and st.manifest.step >= src.manifest.step:
            return True
        src_t = ctl.fleet.hosts[src.host].transport
        dst_t = ctl.fleet.hosts[spare].transport
        folder = replica_dir(ctl.inv.host_root(spare), job)
        stem = f"step-{src.manifest.step:010d}"
        t0 = time.perf_counter()
        try:
            await dst_t.connect()
            await dst_t.makedirs(folder)
            result = await transfer(
                src_t,
                src.path,
                dst_t,
                posixpath.join(folder, stem + ".pt"),
                sha256=src.manifest.sha256,
            )
            part = posixpath.join(folder, stem + ".json.part")
            await dst_t.write_chunks(part, _once(msgspec.json.encode(src.manifest)))
            await dst_t.rename(part, posixpath.join(folder, stem + ".json"))
        except TransportError as e:
            ctl.journal.record(
                Kind.REPLICA,
                f"{job}: replica of step {src.manifest.step} to {spare} failed: {e}",
                job=job,
                host=spare,
                data={"step": src.manifest.step, "ok": False, "error": str(e)},
            )
            self._failing(job, spare, str(e))
            return False
        st.manifest, st.at = src.manifest, time.time()
        st.kept.append(src.manifest.step)
        ctl.journal.record(
            Kind.REPLICA,
            f"{job}: step {src.manifest.step} replicated to {spare} ({result.mb_per_s:.0f} MB/s)",
            job=job,
            host=spare,
            data={
                "step": src.manifest.step,
                "ok": True,
                "seconds": time.perf_counter() - t0,
                "bytes": src.manifest.size,
                "epoch": src.manifest.epoch,
            },
        )
        self._recovered(job, spare, src.manifest.step)
        await self._prune(spare, folder, st)
        return True

    def _failing(self, job: str, spare: str, error: str) -> None:
        """A spare whose disk is full is an incident until a replica reaches it again: nothing
        is lost yet, but a failover would lose more."""
        full = any(s in error.lower() for s in ("no space", "disk full", "quota"))
        if not full or (job, spare) in self._incidents:
            return  # other failures (a source or spare gone) are the host's incident
        sup = self.ctl.jobs.get(job)
        step = sup.step if sup is not None else 0
        n = self.ctl.incidents.open(
            job,
            spare,
            "disk_full",
            fault_at=time.time(),
            last_step=step,
            msg=f"replicas to {spare} fail: {error}",
        )
        self.ctl.incidents.phase(n, job, "decided", action="retry with the next checkpoint")
        self._incidents[(job, spare)] = n

    def _recovered(self, job: str, spare: str, step: int) -> None:
        n = self._incidents.pop((job, spare), None)
        if n is None:
            return
        sup = self.ctl.jobs.get(job)
        last = sup.step if sup is not None else step
        self.ctl.incidents.phase(n, job, "transfer_done", step=step)
        self.ctl.incidents.phase(n, job, "loaded", step=last)  # training never stopped
        self.ctl.incidents.phase(n, job, "first_step", step=last)

    async def _prune(self, spare: str, folder: str, st: ReplicaState) -> None:
        keep = self.ctl.inv.console.replicas_kept
        old, st.kept = st.kept[:-keep], st.kept[-keep:]
        dst_t = self.ctl.fleet.hosts[spare].transport
        for step in old:
            stem = posixpath.join(folder, f"step-{step:010d}")
            with contextlib.suppress(TransportError):
                await dst_t.remove(stem + ".json")
                await dst_t.remove(stem + ".pt")
