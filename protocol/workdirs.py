"""Where a job lives on a host (its workdir under the host's root), the executor's Unix
sockets there, and the one limit on their paths.

A socket's path must fit in ``sun_path`` (108 bytes on Linux, NUL included). Each socket is
bound under a hidden name (``.`` + its name) and renamed into place, so the hidden name is
the longest path bound. The console checks a host's root against it when it reads the
inventory; the executor checks again before it binds (a root that ``~`` expands on the host).
"""

from __future__ import annotations

import posixpath

MAX_SOCKET_PATH = 107
"""Bytes a Unix socket's path may hold (``sun_path`` less its NUL)."""
EXECUTOR_SOCKET = "executor.sock"
TWIN_SOCKET = "twin.sock"


def job_dir(root: str, job: str) -> str:
    """A job's workdir on a host whose root is ``root``."""
    return posixpath.join(root, "jobs", job)


def staged(name: str) -> str:
    """The hidden name a socket is bound under before it is renamed into place."""
    return "." + name


def too_long(workdir: str) -> str | None:
    """Why a job's sockets cannot be bound in ``workdir`` (the longest path, its length), or
    None when they fit."""
    longest = max((EXECUTOR_SOCKET, TWIN_SOCKET), key=len)
    path = posixpath.join(workdir, staged(longest))
    size = len(path.encode())
    if size <= MAX_SOCKET_PATH:
        return None
    return (
        f"its executor socket would be {path} ({size} bytes; a Unix socket path holds at most "
        f"{MAX_SOCKET_PATH})"
    )
