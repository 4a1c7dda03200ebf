"""The Python API of the programs the console runs on a host (``console/reach/host/``): each run
with the host's own interpreter, its arguments one argv entry each, never spliced; its answer
read and checked here."""

from __future__ import annotations

import json
import posixpath
from dataclasses import dataclass
from enum import Enum

import msgspec

from console.reach.host import kill, listing, locked, source
from console.reach.host import promote as promoting
from console.reach.transport.base import PermanentTransportError, Transport
from console.replication import replica_rules as rules
from protocol.spec import CheckpointManifest

LIST = source(listing)
PROMOTE = source(rules, promoting)
"""The replica rules' source (``check_files``), then the promoting program's."""
LOCKED = source(locked)
KILL = source(kill)


class KillStatus(Enum):
    """How ``kill_executor`` ended, by the remote program's exit status."""

    KILLED = kill.KILLED
    """The pid in executor.pid held the workdir's lock; it was SIGKILLed and is gone."""
    NOT_HELD = kill.NOT_HELD
    """Nothing held the lock: no executor to kill (its command group was reaped all the same)."""
    REFUSED = kill.REFUSED
    """executor.pid names no process that holds the lock: nothing was killed. With no
    executor.pid at all, the lock is first given 2 s to be let go of (an executor ending
    removes its pid file before its process lets go), then NOT_HELD."""
    SURVIVED = kill.SURVIVED
    """SIGKILL was sent, yet the pid was still alive at the deadline (stuck in the kernel?)."""
    LEFTOVERS = kill.LEFTOVERS
    """The executor is gone, but its command group was not reaped in time."""


@dataclass(frozen=True)
class KillResult:
    status: KillStatus
    pid: int | None
    """What executor.pid said."""
    holders: list[int]
    """The pids /proc/locks named as holding the lock."""
    reaped: int
    """Processes of the recorded command group killed."""
    why: str


async def list_manifests(
    t: Transport, python: str, folder: str, *, timeout: float = 30
) -> list[CheckpointManifest]:
    """The complete checkpoints (manifests) in a folder on the host, oldest first."""
    return (await list_manifests_in(t, python, [folder], timeout=timeout))[folder]


async def list_manifests_in(
    t: Transport, python: str, folders: list[str], *, timeout: float = 30
) -> dict[str, list[CheckpointManifest]]:
    """The complete checkpoints in each of these folders on the host, oldest first: one
    remote program for all of them."""
    result = await t.run([python, "-c", LIST, *folders], timeout=timeout)
    if result.returncode != 0:
        raise PermanentTransportError(
            f"{t.name}: listing {', '.join(folders)} failed: {result.stderr.strip()[-200:]}"
        )
    listed = json.loads(result.stdout or "[]")
    out: dict[str, list[CheckpointManifest]] = {}
    for folder, items in zip(folders, listed, strict=True):
        found = []
        for item in items:
            try:
                m = msgspec.convert(item, CheckpointManifest)
            except msgspec.ValidationError:
                continue
            if sound(m):
                found.append(m)
        out[folder] = sorted(found, key=lambda m: m.step)
    return out


def sound(m: CheckpointManifest) -> bool:
    """A manifest whose folder's files (if any) are paths under it that add up to its size
    and sha256: one to copy or promote (a host's word is no path to read or write)."""
    if m.files is None:
        return True
    files = [(f.path, f.size, f.sha256) for f in m.files]
    return rules.check_files(files, m.size, m.sha256) is None


async def promote(
    t: Transport,
    python: str,
    replica_folder: str,
    checkpoints: str,
    step: int,
    *,
    timeout: float = 60,
) -> None:
    """Make one replica (and the older ones kept beside it) an executor's checkpoints: a
    folder's files each linked by the path its manifest lists, once every path is checked."""
    stem = f"step-{step:010d}"
    result = await t.run(
        [python, "-c", PROMOTE, replica_folder, checkpoints, stem], timeout=timeout
    )
    if result.returncode != 0:
        raise PermanentTransportError(
            f"{t.name}: promoting replica {stem} failed: {result.stderr.strip()[-200:]}"
        )


async def kill_executor(
    t: Transport, python: str, workdir: str, *, timeout: float = 10
) -> KillResult:
    """SIGKILL the executor of ``workdir`` by its recorded pid, never by a name pattern.

    The pid in executor.pid is killed only if /proc/locks shows it holding the flock on that
    workdir's executor.lock (same device and inode); then the command group it recorded is
    reaped, holding the lock so no new executor starts meanwhile. ``timeout`` bounds the
    waits on the host; a status the program does not know is a PermanentTransportError.
    """
    result = await t.run([python, "-c", KILL, workdir, str(timeout)], timeout=timeout + 20)
    try:
        status = KillStatus(result.returncode)
        report = json.loads(result.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise PermanentTransportError(
            f"{t.name}: killing the executor of {workdir} failed (exit {result.returncode}): "
            f"{result.stderr.strip()[-300:]}"
        ) from None
    return KillResult(
        status, report.get("pid"), report.get("holders", []), report.get("reaped", 0), report["why"]
    )


async def executor_alive(t: Transport, python: str, workdir: str, *, timeout: float = 10) -> bool:
    """Does a live executor hold the workdir's lock? (The kernel drops it when the process dies.)"""
    result = await t.run(
        [python, "-c", LOCKED, posixpath.join(workdir, kill.LOCK)], timeout=timeout
    )
    return result.returncode == locked.HELD
