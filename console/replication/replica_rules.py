"""Which files of a spare's replica folder stay, and whether a copy fits: one source for both sides.

The console applies these rules itself on a host it reaches cheaply (a local folder), and
ships this very file, as text, at the head of the program that receives a replica on an SSH
host (``replica_receiver.py``), so the two can never disagree. Hence: the standard
library only, and nothing newer than the oldest Python a host may run.
"""

from __future__ import annotations

import hashlib
import posixpath
import re

REPLICA_NAME = re.compile(r"step-(\d{10})\.(pt|json)(\.part)?")


def survey(names: list[str]) -> tuple[list[int], list[str]]:
    """Steps of the complete replicas in a folder (oldest first), and the leftovers of copies
    that did not finish (parts, data without its manifest, a manifest without its data)."""
    found: dict[int, set[str]] = {}
    for name in names:
        match = REPLICA_NAME.fullmatch(name)
        if match is not None:
            found.setdefault(int(match.group(1)), set()).add(name)
    complete: list[int] = []
    leftovers: list[str] = []
    for step, have in sorted(found.items()):
        whole = {f"step-{step:010d}.pt", f"step-{step:010d}.json"}
        if whole <= have:
            complete.append(step)
            leftovers += sorted(have - whole)
        else:
            leftovers += sorted(have)
    return complete, leftovers


def split_older(complete: list[int], step: int, keep: int) -> tuple[list[int], list[int]]:
    """The complete replicas older than ``step``: those to retire, and the ``keep`` newest
    that stay (oldest first)."""
    older = [s for s in complete if s < step]
    cut = max(len(older) - keep, 0)
    return older[:cut], older[cut:]


def keep_before(replicas_kept: int) -> int:
    """Older replicas a copy leaves in place while it runs: never the newest complete one."""
    return max(replicas_kept - 1, 1)


def keep_after(replicas_kept: int) -> int:
    """Older replicas that stay once the copy is complete: with it, ``replicas_kept`` in all."""
    return replicas_kept - 1


def blocks(n: int, block: int) -> int:
    """Bytes a file of ``n`` bytes takes on disk: whole blocks."""
    return -(-n // block) * block


def room(
    size: int, manifest_bytes: int, block: int, floor: int, sizes: list[int] | None = None
) -> tuple[int, int]:
    """What a copy needs on the spare's disk, and what must stay free beside it: the
    ``floor`` (min_free_disk_gb), and at least room for one more checkpoint (a promoted
    spare writes its next one before pruning). ``sizes``: a folder's files, each in whole
    blocks (``size`` is their sum)."""
    data = blocks(size, block) if sizes is None else sum(blocks(n, block) for n in sizes)
    return data + blocks(manifest_bytes, block), max(floor, data)


def step_stem(step: int) -> str:
    return f"step-{step:010d}"


def unsafe_path(rel: object) -> str | None:
    """Why a folder checkpoint's file path (from a manifest: a host's word) is not one to
    write or read under the folder; None when it is relative, normalised and free of '..'."""
    if not isinstance(rel, str) or not rel:
        return f"{rel!r} is not a path"
    if rel.startswith("/"):
        return f"{rel!r} is absolute"
    if "\0" in rel or ".." in rel.split("/"):
        return f"{rel!r} leaves the folder"
    if posixpath.normpath(rel) != rel or rel == ".":
        return f"{rel!r} is not normalised"
    return None


def check_files(files: list[tuple[str, int, str]], size: int, sha256: str) -> str | None:
    """Why a folder checkpoint's list of files (path, size, sha256) cannot be written under
    its folder, or does not add up to the manifest's ``size`` and ``sha256``; None if sound."""
    seen: set[str] = set()
    for path, n, digest in files:
        why = unsafe_path(path)
        if why is None and path in seen:
            why = f"{path!r} is listed twice"
        if why is None and (not isinstance(n, int) or n < 0 or not isinstance(digest, str)):
            why = f"{path!r} has no size and sha256"
        if why is not None:
            return "manifest: " + why
        seen.add(path)
    for path in seen:
        parent = posixpath.dirname(path)
        while parent:
            if parent in seen:
                return f"manifest: {parent!r} is a file and a folder"
            parent = posixpath.dirname(parent)
    if sum(n for _, n, _ in files) != size or tree_digest(files) != sha256:
        return "manifest: its files do not add up to its size and sha256"
    return None


def tree_digest(files: list[tuple[str, int, str]]) -> str:
    """A folder's sha256: over one line ``SHA256 SIZE PATH`` per file, in path order."""
    h = hashlib.sha256()
    for path, n, digest in sorted(files):
        h.update(f"{digest} {n} {path}\n".encode())
    return h.hexdigest()
