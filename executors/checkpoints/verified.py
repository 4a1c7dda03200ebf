"""Checkpoint bytes verified ahead of need, kept for the load that follows.

An idle executor (a failover target waiting for Start) reads the newest checkpoint in its folder
and checks its sha256 while the old host's lease runs out (``publish.read_ahead``); the load
after Start then takes those bytes instead of reading and hashing the file again: for a large
checkpoint, the hash alone is seconds off a failover's critical path.

One file's bytes are kept, keyed by the file's identity as ``fstat`` gives it (device, inode,
size, modification and change times) and the manifest's sha256: any write to the file, a
rename over it or another manifest misses, and the bytes kept always match the sha256 they are
looked up under. A lookup takes them (the memory is freed once loaded).
"""

from __future__ import annotations

import os
import threading

Key = tuple[str, int, int, int, int, int, str]

_lock = threading.Lock()
_kept: tuple[Key, bytes] | None = None


def key(path: str, st: os.stat_result, sha256: str) -> Key:
    return (path, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, sha256)


def take(k: Key) -> bytes | None:
    """The bytes kept under ``k``, no longer kept; None if other bytes (or none) are."""
    global _kept
    with _lock:
        if _kept is None or _kept[0] != k:
            return None
        data, _kept = _kept[1], None
        return data


def holds(k: Key) -> bool:
    with _lock:
        return _kept is not None and _kept[0] == k


def keep(k: Key, data: bytes) -> None:
    """Keep ``data`` (verified against the sha256 in ``k``) in place of whatever was kept."""
    global _kept
    with _lock:
        _kept = (k, data)


def drop() -> None:
    global _kept
    with _lock:
        _kept = None
