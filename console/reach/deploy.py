"""Putting the executor on a host: the bundle (executors/ + protocol/), content-hashed, once per hash.

Host layout under the host's ``root``::

    bundles/HASH/          the unpacked bundle; HASH/.complete marks it usable
    bundles/HASH.staging-* a deploy under way (renamed to HASH once whole)
    jobs/JOB/              an executor's workdir (checkpoints, socket, events)
    replicas/JOB/          checkpoints replicated here from the job's primary
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import posixpath
import secrets
import tarfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from console.reach.host import extract, source
from console.reach.transport.base import PermanentTransportError, Transport, TransportError
from protocol.version import bundle_files, source_hash
from protocol.workdirs import job_dir as job_dir

EXTRACT = source(extract)


MARKER = ".complete"
STAGING = ".staging-"
"""A deploy unpacks to ``HASH.staging-RANDOM`` beside its place, then renames it there."""
STALE = ".stale-"


@dataclass(frozen=True)
class Bundle:
    hash: str
    tarball: bytes


@dataclass(frozen=True)
class Deployed:
    path: str
    uploaded: bool
    """This call's copy is the one in place (False: it was there, or another deploy won)."""


def _source_root() -> Path:
    """The folder holding the executors/ and protocol/ packages, found without importing executors."""
    spec = importlib.util.find_spec("protocol")
    assert spec is not None and spec.submodule_search_locations
    return Path(next(iter(spec.submodule_search_locations))).resolve().parent


@cache
def build_bundle() -> Bundle:
    root = _source_root()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=6) as tar:
        for path in bundle_files(root):
            info = tarfile.TarInfo(str(path.relative_to(root)))
            data = path.read_bytes()
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            tar.addfile(info, io.BytesIO(data))
    return Bundle(hash=source_hash(root), tarball=buf.getvalue())


def bundle_dir(root: str, bundle: Bundle) -> str:
    return posixpath.join(root, "bundles", bundle.hash)


def replica_dir(root: str, job: str) -> str:
    return posixpath.join(root, "replicas", job)


def checkpoint_file(root: str, job: str, step: int) -> str:
    """Where an executor of ``job`` keeps the data of its checkpoint at ``step``: derived here,
    never taken from what a host reports (a host's word is no path to read from)."""
    return posixpath.join(job_dir(root, job), "checkpoints", f"step-{step:010d}.pt")


def replica_file(root: str, job: str, step: int) -> str:
    return posixpath.join(replica_dir(root, job), f"step-{step:010d}.pt")


async def _once(data: bytes) -> AsyncIterator[bytes]:
    yield data


async def deploy(t: Transport, root: str, python: str, bundle: Bundle | None = None) -> Deployed:
    """Make the bundle usable on the host; uploads only when this hash is not there yet.

    The bundle is unpacked under a unique name beside its place, marked complete there and
    renamed into place in one step, so a folder at its place is always whole: two consoles
    (or two jobs of one console) deploying at once both succeed, and the loser uses the
    winner's copy.
    """
    bundle = bundle or build_bundle()
    dest = bundle_dir(root, bundle)
    if await t.stat(posixpath.join(dest, MARKER)) is not None:
        return Deployed(dest, uploaded=False)
    staging = f"{dest}{STAGING}{secrets.token_hex(6)}"
    placed = False
    try:
        await _unpack(t, python, bundle, staging)
        placed = await _place(t, staging, dest)
    finally:
        if not placed:
            for leftover in (f"{staging}.tar.gz", staging):
                with contextlib.suppress(TransportError):
                    await t.remove(leftover)
    return Deployed(dest, uploaded=placed)


async def _unpack(t: Transport, python: str, bundle: Bundle, folder: str) -> None:
    """The bundle unpacked and synced into ``folder``, its completion marker last."""
    await t.makedirs(folder)
    tar_path = f"{folder}.tar.gz"
    await t.write_chunks(tar_path, _once(bundle.tarball))
    try:
        result = await t.run([python, "-c", EXTRACT, tar_path, folder])
    finally:
        await t.remove(tar_path)
    if result.returncode != 0:
        line = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise PermanentTransportError(
            f"{t.name}: unpacking the executor bundle with {python} failed: {line}"
        )
    await t.write_chunks(posixpath.join(folder, MARKER), _once(bundle.hash.encode()))


async def _place(t: Transport, staging: str, dest: str) -> bool:
    """Rename the staged bundle to ``dest``; False when another deploy put a whole one there.

    rename(2) never replaces a folder that has files, so a winner's bundle stays. A folder
    there without the marker was left by a console older than staged deploys and is moved
    aside (one step, like the winner's rename), never deleted in place: if a winner's whole
    bundle was what got moved, it goes back.
    """
    marker = posixpath.join(dest, MARKER)
    why: TransportError | None = None
    for _ in range(3):
        try:
            await t.rename(staging, dest)
            return True
        except PermanentTransportError as e:
            why = e
        if await t.stat(marker) is not None:
            return False
        if await t.stat(dest) is None:
            continue  # it went between our rename and the look: try again
        aside = f"{dest}{STALE}{secrets.token_hex(6)}"
        with contextlib.suppress(PermanentTransportError):
            await t.rename(dest, aside)
        if await t.stat(posixpath.join(aside, MARKER)) is not None:
            with contextlib.suppress(PermanentTransportError):
                await t.rename(aside, dest)
        await t.remove(aside)
    if await t.stat(marker) is not None:
        return False
    raise PermanentTransportError(
        f"{t.name}: could not put the executor bundle at {dest}: {why}",
        errno=why.errno if why else None,
    )


def executor_command(
    python: str, bundle_path: str, args: list[str]
) -> tuple[list[str], dict[str, str]]:
    """argv and environment that run ``hotspare-executor ARGS`` from a deployed bundle."""
    return [python, "-m", "executors.cli", *args], {
        "PYTHONPATH": bundle_path,
        "PYTHONUNBUFFERED": "1",
    }
