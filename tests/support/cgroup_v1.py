"""A cgroup v1 group of this test process's own, under one controller (``cpu``, ``cpuacct``):
made beside nothing else, joined by this process (whatever it starts later is in it too), and
left with everything in it moved back home. The tests' CPU accounting and their confined
starvation use it; the executors' own cgroups (v2, ``executors/fencing/cgroup.py``) are a
different hierarchy and unaffected."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

MOUNT = Path("/sys/fs/cgroup")


def own(controller: str) -> Path | None:
    """This process's group under ``controller`` (None: no writable v1 hierarchy of it)."""
    root = MOUNT / controller
    if not (root / "cgroup.procs").exists():
        return None
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            return root / path.lstrip("/")
    return None


class Group:
    """A child of this process's group under ``controller``, named ``name``, with ``settings``
    written (file -> value), joined by this process. Raises OSError where it cannot be."""

    def __init__(self, controller: str, name: str, settings: dict[str, str] | None = None) -> None:
        home = own(controller)
        if home is None:
            raise OSError(f"no cgroup v1 {controller} hierarchy")
        self.home, self.path = home, home / f"{name}-{os.getpid()}"
        self.path.mkdir(exist_ok=True)
        try:
            for file, value in (settings or {}).items():
                (self.path / file).write_text(value)
            (self.path / "cgroup.procs").write_text(str(os.getpid()))
        except OSError:
            self.leave()
            raise

    def read(self, file: str) -> str:
        return (self.path / file).read_text()

    def leave(self) -> None:
        """This process and every one still in the group back home; the group goes (kept,
        empty, while one that cannot be moved, a zombie not yet reaped, is still in it)."""
        with contextlib.suppress(OSError):
            for pid in (self.path / "cgroup.procs").read_text().split():
                with contextlib.suppress(OSError):  # gone meanwhile
                    (self.home / "cgroup.procs").write_text(pid)
        with contextlib.suppress(OSError):
            self.path.rmdir()
