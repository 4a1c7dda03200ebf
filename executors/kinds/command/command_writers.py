"""Who may still be writing a checkpoint: the run's own processes and their open files, read
from /proc, so a closed checkpoint is taken at once rather than ``settle_s`` later.

The run's processes are those of its cgroup (``cgroup.procs``, the run's and every cgroup
under it), else the descendants of its fence, a child subreaper that every process the run
starts stays under whatever session it moves to (``executors.fencing``). The run's process
group alone would not do: torchrun's workers start sessions of their own. A file is open for
writing when one of them has a descriptor on its inode (``/proc/PID/fd/N`` followed: the same
device and inode, whatever name or mount namespace the process sees it by) whose access mode
(``/proc/PID/fdinfo/N`` ``flags``) is write-only or read-write.

Everything read is answered by the kernel from memory: the cgroup's ``cgroup.procs``,
``/proc/PID/stat``, the ``fd`` folder and ``fdinfo``; ``/proc/PID/maps`` is never read (it
takes the process's memory-map lock, which a process stuck in a GPU driver may hold for good),
so a file written only through a shared writable mapping is not seen. A scan that meets a
process whose tables it may not read, or that runs past ``SCAN_BUDGET_S``, knows nothing
(None): the caller falls back to ``settle_s``.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from executors.fencing import cgroup
from executors.fencing.fence import children_of
from protocol.errors import HotspareError

FileId = tuple[int, int]
"""A file's (st_dev, st_ino)."""
Proc = tuple[int, int]
"""A process: (pid, start time in clock ticks after boot), so a reused pid is another one."""

SCAN_BUDGET_S = 0.5
"""A scan of the run's descriptors that takes longer than this gives up (knows nothing)."""
LOCAL_FS = frozenset(
    {"ext2", "ext3", "ext4", "xfs", "btrfs", "tmpfs", "ramfs", "zfs", "f2fs", "bcachefs",
     "overlay", "jfs", "reiserfs", "nilfs2"}
)  # fmt: skip
"""Filesystems whose files only this host's processes write. On a network or FUSE filesystem
another host, or a daemon, may be the writer: no process here holding a file open says
nothing there."""


def mount_fs(path: Path, mountinfo: str = "/proc/self/mountinfo") -> str | None:
    """The type of the filesystem ``path`` is on (the mount with the longest matching mount
    point), or None when it cannot be read."""
    try:
        lines = Path(mountinfo).read_text().splitlines()
    except OSError:
        return None
    target = os.path.realpath(path)
    best, fs = -1, None
    for line in lines:
        left, _, right = line.partition(" - ")
        fields = left.split()
        if len(fields) < 5 or not right:
            continue
        point = _unescape(fields[4])
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) > best:
            best, fs = len(point), right.split()[0]
    return fs


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes (``\\040``)."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def file_ids(path: Path, also: tuple[Path, ...] = ()) -> set[FileId]:
    """The inodes of a checkpoint: the file, or every regular file under the folder, and
    ``also`` (its marker beside it); what is gone meanwhile is left out."""
    ids: set[FileId] = set()
    for p in (path, *also):
        try:
            st = os.stat(p)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            ids.add((st.st_dev, st.st_ino))
        elif stat.S_ISDIR(st.st_mode):
            for here, _dirs, files in os.walk(p):
                for name in files:
                    try:
                        f = os.lstat(os.path.join(here, name))
                    except OSError:
                        continue
                    if stat.S_ISREG(f.st_mode):
                        ids.add((f.st_dev, f.st_ino))
    return ids


PF_EXITING = 0x4
"""/proc/PID/stat flags: the process has begun to exit. The kernel sets it before it closes the
process's files, so a process seen with its files gone but not yet a zombie is seen ending."""


def _proc(pid: int) -> Proc | None:
    """(pid, start time) of a live process; None once it has begun to end (a zombie, or one
    exiting, whose open files may already be gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    fields = raw[raw.rfind(b")") + 2 :].split()
    if len(fields) < 20 or fields[0] in (b"Z", b"X") or int(fields[6]) & PF_EXITING:
        return None
    return pid, int(fields[19])


class _Unreadable(HotspareError):
    permanent = True

    pass


def _writes(pid: int, fd: str) -> bool:
    """Is descriptor ``fd`` of ``pid`` open write-only or read-write?"""
    try:
        with open(f"/proc/{pid}/fdinfo/{fd}", "rb") as f:
            for line in f.read().splitlines():
                if line.startswith(b"flags:"):
                    return int(line.split()[1], 8) & os.O_ACCMODE in (os.O_WRONLY, os.O_RDWR)
    except FileNotFoundError:  # closed meanwhile
        return False
    except (OSError, ValueError, IndexError):
        raise _Unreadable from None
    raise _Unreadable


def _holding(pid: int, wanted: set[FileId], deadline: float) -> set[FileId] | None:
    """Which of ``wanted`` ``pid`` holds open for writing; None when its table is unreadable
    (not ours, past the deadline); an ended process holds nothing."""
    held: set[FileId] = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except FileNotFoundError:
        return held
    except OSError:
        return None
    for fd in fds:
        if time.monotonic() > deadline:
            return None
        try:
            st = os.stat(f"/proc/{pid}/fd/{fd}")
        except FileNotFoundError:
            continue
        except OSError:
            return None
        fid = (st.st_dev, st.st_ino)
        if fid not in wanted or fid in held:
            continue
        try:
            if _writes(pid, fd):
                held.add(fid)
        except _Unreadable:
            return None
    return held


@dataclass(frozen=True)
class Scan:
    """The run's processes as one scan saw them, and what of the files asked about they held
    open for writing."""

    live: frozenset[Proc]
    held: dict[FileId, Proc]
    """File -> one process that holds it open for writing."""


class Writers:
    """The run's processes, read through ``pids`` (None or []: not known now)."""

    def __init__(self, pids: Callable[[], list[int] | None]) -> None:
        self._pids = pids

    def live(self) -> frozenset[Proc] | None:
        """The run's live processes now; None when not known."""
        pids = self._pids()
        if not pids:
            return None
        live = frozenset(p for pid in pids if (p := _proc(pid)) is not None)
        return live or None

    def scan(self, wanted: set[FileId], budget_s: float = SCAN_BUDGET_S) -> Scan | None:
        """The run's live processes and which of ``wanted`` they hold open for writing; None
        when some process's descriptors could not be read in time."""
        pids = self._pids()
        if not pids:
            return None
        deadline = time.monotonic() + budget_s
        live: set[Proc] = set()
        held: dict[FileId, Proc] = {}
        for pid in pids:
            proc = _proc(pid)
            if proc is None:
                continue
            got = _holding(pid, wanted, deadline)
            if got is None:
                return None
            if _proc(pid) != proc:  # it ended while its files were read: they said nothing
                continue  # (a writer killed mid-write had its file closed by its end: torn)
            live.add(proc)
            held.update(dict.fromkeys(got - held.keys(), proc))
        return Scan(frozenset(live), held)


def run_pids(cg: Path | None, fence_pid: int | None) -> list[int] | None:
    """A run's processes: those of its cgroup, else the live descendants of its fence (None:
    neither is known)."""
    if cg is not None:
        return cgroup.procs(cg)
    return None if fence_pid is None else sorted(children_of(fence_pid))
