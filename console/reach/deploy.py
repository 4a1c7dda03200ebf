"""Putting the executor on a host: the bundle (executors/ + protocol/), content-hashed, once per hash.

Host layout under the host's ``root``::

    bundles/HASH/          the unpacked bundle; HASH/.complete marks it usable
    jobs/JOB/              an executor's workdir (checkpoints, socket, events)
    replicas/JOB/          checkpoints replicated here from the job's primary
"""

from __future__ import annotations

import importlib.util
import io
import posixpath
import tarfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from console.reach.transport.base import PermanentTransportError, Transport
from protocol.version import bundle_files, source_hash

_EXTRACT = r"""
import os, sys, tarfile
with tarfile.open(sys.argv[1]) as t:
    if hasattr(tarfile, "data_filter"):
        t.extractall(sys.argv[2], filter="data")
    else:  # Python < 3.11.4: allow only plain files with safe relative names
        for m in t.getmembers():
            if not m.isfile() or m.name.startswith("/") or ".." in m.name.split("/"):
                sys.exit("unsafe member in bundle: %r" % m.name)
        t.extractall(sys.argv[2])
"""


@dataclass(frozen=True)
class Bundle:
    hash: str
    tarball: bytes


@dataclass(frozen=True)
class Deployed:
    path: str
    uploaded: bool


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


def job_dir(root: str, job: str) -> str:
    return posixpath.join(root, "jobs", job)


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
    """Make the bundle usable on the host; uploads only when this hash is not there yet."""
    bundle = bundle or build_bundle()
    dest = bundle_dir(root, bundle)
    marker = posixpath.join(dest, ".complete")
    if await t.stat(marker) is not None:
        return Deployed(dest, uploaded=False)
    await t.remove(dest)
    await t.makedirs(dest)
    tar_path = f"{dest}.tar.gz"
    await t.write_chunks(tar_path, _once(bundle.tarball))
    result = await t.run([python, "-c", _EXTRACT, tar_path, dest])
    await t.remove(tar_path)
    if result.returncode != 0:
        line = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise PermanentTransportError(
            f"{t.name}: unpacking the executor bundle with {python} failed: {line}"
        )
    await t.write_chunks(marker, _once(bundle.hash.encode()))
    return Deployed(dest, uploaded=True)


def executor_command(
    python: str, bundle_path: str, args: list[str]
) -> tuple[list[str], dict[str, str]]:
    """argv and environment that run ``hotspare-executor ARGS`` from a deployed bundle."""
    return [python, "-m", "executors.cli", *args], {
        "PYTHONPATH": bundle_path,
        "PYTHONUNBUFFERED": "1",
    }
