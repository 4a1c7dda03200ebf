"""A local host's processes as one thing to end: what a power cut does to a real host.

Every process the local transport starts detached (executors, warm twins) joins the host's
cgroup v2 (``hotspare-local/HOST-HASH`` under the hierarchy's root, the same for every console
that opens the host), where the machine gives one; everything they start stays in it, or in
a cgroup under it (each run's), whatever session it moves to. ``kill`` kills that cgroup whole
and, where there is none, every descendant of the recorded root pids (executor.pid,
twin.pid), frozen first so nothing forks away meanwhile. Processes are found by recorded pid
and cgroup only, never by a name pattern.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import time
from pathlib import Path

KILL_TIMEOUT_S = 10.0
FOLDER = "hotspare-local"


def _hierarchy() -> Path | None:
    try:
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    for line in mounts:
        before, _, after = line.partition(" - ")
        if after.startswith("cgroup2 "):
            return Path(before.split()[4])
    return None


def host_cgroup(name: str, root: str) -> Path | None:
    """The host's cgroup, made if need be; None where this machine gives none."""
    top = _hierarchy()
    if top is None:
        return None
    digest = hashlib.sha256(f"{name}\0{os.path.realpath(root)}".encode()).hexdigest()[:16]
    path = top / FOLDER / f"{name[:40]}-{digest}"
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return path if (path / "cgroup.kill").exists() else None


def joined(cg: Path | None, argv: list[str]) -> list[str]:
    """``argv`` run from a shell that first moves itself into ``cg`` (no cgroup: as it is)."""
    if cg is None:
        return argv
    script = 'echo 0 > "$1/cgroup.procs" || exit 96; shift; exec "$@"'
    return ["sh", "-c", script, "sh", str(cg), *argv]


def _tree() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                raw = Path(f"/proc/{entry}/stat").read_bytes()
                state, ppid = raw[raw.rfind(b")") + 2 :].split()[:2]
                if state not in (b"Z", b"X"):
                    kids.setdefault(int(ppid), []).append(int(entry))
    return kids


def _under(roots: set[int]) -> set[int]:
    kids, found, todo = _tree(), set(), list(roots)
    while todo:
        pid = todo.pop()
        for kid in kids.get(pid, []):
            if kid not in found:
                found.add(kid)
                todo.append(kid)
    return found


def _in_cgroup(cg: Path) -> set[int]:
    found: set[int] = set()
    for here, _dirs, files in os.walk(cg):
        if "cgroup.procs" in files:
            with contextlib.suppress(OSError, ValueError):
                found |= {int(p) for p in Path(here, "cgroup.procs").read_text().split()}
    return found


def kill(cg: Path | None, roots: set[int]) -> set[int]:
    """SIGKILL everything in ``cg`` and under the live ``roots``; the pids ended."""
    roots = {p for p in roots if Path(f"/proc/{p}").exists()}
    frozen: set[int] = set()
    deadline = time.monotonic() + KILL_TIMEOUT_S
    while time.monotonic() < deadline:  # freeze until the tree stops growing
        found = roots | _under(roots | frozen) | (_in_cgroup(cg) if cg is not None else set())
        new = found - frozen - {os.getpid()}
        if not new:
            break
        for pid in new:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGSTOP)
        frozen |= new
    if cg is not None:
        with contextlib.suppress(OSError):
            (cg / "cgroup.kill").write_text("1")
    for pid in frozen:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    while cg is not None and _in_cgroup(cg) and time.monotonic() < deadline:
        time.sleep(0.02)
    if cg is not None:
        remove_empty(cg, itself=True)
    return frozen


def remove_empty(folder: Path, *, itself: bool = False) -> None:
    """Remove the cgroups under ``folder`` (and ``folder``, with ``itself``) that hold no
    process (a host started again makes its own anew); one still in use stays (the kernel
    refuses). A host's kill removes its own only: it removed every empty one beside it, among
    them another host's made for a start an instant before that start moved into it, and that
    start failed ("cgroup.procs: Directory nonexistent": a fresh-clone run's host lost)."""
    for here, dirs, _files in os.walk(folder, topdown=False):
        for d in dirs:
            with contextlib.suppress(OSError):
                os.rmdir(os.path.join(here, d))
    if itself:
        with contextlib.suppress(OSError):
            os.rmdir(folder)


def local_hosts_folder() -> Path | None:
    """Where the local hosts' cgroups are (None: this machine gives none)."""
    top = _hierarchy()
    return None if top is None else top / FOLDER
