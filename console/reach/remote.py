"""Small Python programs the console runs on a host with its own interpreter (args quoted, never spliced)."""

from __future__ import annotations

import json
import posixpath

import msgspec

from console.reach.transport.base import PermanentTransportError, Transport
from protocol.spec import CheckpointManifest

_LIST = r"""
import glob, json, os, sys
out = []
for p in sorted(glob.glob(os.path.join(sys.argv[1], "step-*.json"))):
    try:
        with open(p) as f:
            out.append(json.load(f))
    except (OSError, ValueError):
        pass
print(json.dumps(out))
"""

_PROMOTE = r"""
import glob, os, shutil, sys
src, dst, stem = sys.argv[1:4]
shutil.rmtree(dst, ignore_errors=True)
os.makedirs(dst)
# the chosen replica and every older one: if the newest turns out damaged, the executor's
# loader skips it for the one before, as with its own checkpoints
for manifest in sorted(glob.glob(os.path.join(src, "step-*.json"))):
    name = os.path.basename(manifest)[: -len(".json")]
    if name > stem or not os.path.exists(os.path.join(src, name + ".pt")):
        continue
    for ext in (".pt", ".json"):
        a, b = os.path.join(src, name + ext), os.path.join(dst, name + ext)
        try:
            os.link(a, b)
        except OSError:
            shutil.copyfile(a, b)
fd = os.open(dst, os.O_RDONLY)
os.fsync(fd)
"""

_LOCKED = r"""
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
except BlockingIOError:
    sys.exit(75)
"""

LOCK_HELD = 75


async def list_manifests(
    t: Transport, python: str, folder: str, *, timeout: float = 30
) -> list[CheckpointManifest]:
    """The complete checkpoints (manifests) in a folder on the host, oldest first."""
    result = await t.run([python, "-c", _LIST, folder], timeout=timeout)
    if result.returncode != 0:
        raise PermanentTransportError(
            f"{t.name}: listing {folder} failed: {result.stderr.strip()[-200:]}"
        )
    out = []
    for item in json.loads(result.stdout or "[]"):
        try:
            out.append(msgspec.convert(item, CheckpointManifest))
        except msgspec.ValidationError:
            continue
    return sorted(out, key=lambda m: m.step)


async def promote(
    t: Transport,
    python: str,
    replica_folder: str,
    checkpoints: str,
    step: int,
    *,
    timeout: float = 60,
) -> None:
    """Make one replica (and the older ones kept beside it) an executor's checkpoints."""
    stem = f"step-{step:010d}"
    result = await t.run(
        [python, "-c", _PROMOTE, replica_folder, checkpoints, stem], timeout=timeout
    )
    if result.returncode != 0:
        raise PermanentTransportError(
            f"{t.name}: promoting replica {stem} failed: {result.stderr.strip()[-200:]}"
        )


async def executor_alive(t: Transport, python: str, workdir: str, *, timeout: float = 10) -> bool:
    """Does a live executor hold the workdir's lock? (The kernel drops it when the process dies.)"""
    result = await t.run(
        [python, "-c", _LOCKED, posixpath.join(workdir, "executor.lock")], timeout=timeout
    )
    return result.returncode == LOCK_HELD
