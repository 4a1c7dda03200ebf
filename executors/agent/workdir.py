"""A job's folder on a host: the names of what lives there, the lock that keeps it to one
executor, and the record of the command group an executor of the ``command`` kind started.

The record (``command.pgid``: JSON ``{"pgid": N or null, "token": HEX, "cgroup": PATH or ""}``)
outlives an executor that is SIGKILLed. The run's fence (``executors.fencing``) ends the run
when its executor dies; the record is for what a fence could not end (the fence itself
SIGKILLed, a host without cgroups): the next executor on the workdir reaps it before it starts
anything (``reap_command``): the run's cgroup killed whole, then every process that carries
the token in its environment (``HOTSPARE_RUN_TOKEN``) and the recorded group while one of
them is in it (a process group id is reused once the group is empty).
console/reach/remote.py reads the same record on a host; keep the two in step.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import signal
import time
from collections.abc import Callable
from pathlib import Path

from executors.durable import atomic_write
from executors.fencing import cgroup
from protocol.errors import HotspareError

PID = "executor.pid"
LOCK = "executor.lock"
EVENTS = "events.jsonl"
CRASH = "crash.log"
CHECKPOINTS = "checkpoints"
COMMAND_GROUP = "command.pgid"
TOKEN_ENV = "HOTSPARE_RUN_TOKEN"
REAP_TIMEOUT_S = 10.0


class WorkdirBusy(HotspareError):
    """Another live executor holds the workdir; starting a second would be a split brain."""

    permanent = False


class CommandLingers(WorkdirBusy):
    """Processes of the previous command outlived SIGKILL (say, stuck in the kernel on a GPU):
    the workdir is not free for a new run beside them."""


def acquire(workdir: Path) -> int:
    """Hold the workdir's lock for this process's life (the kernel drops it, even on SIGKILL).

    The pid file is written at once, so it names the lock's holder from the first moment: a
    console kills an executor only when the two agree.
    """
    return hold(
        workdir,
        LOCK,
        PID,
        lambda holder: WorkdirBusy(
            f"{workdir}: another executor (pid {holder}) is already running here"
        ),
    )


def hold(workdir: Path, lock: str, pid: str, busy: Callable[[str], Exception]) -> int:
    """Hold ``workdir/lock`` (flock, not inherited) for this process's life and record this
    process in ``workdir/pid``; ``busy(holder pid)`` is raised when another process holds it."""
    workdir.mkdir(parents=True, exist_ok=True)
    fd = os.open(workdir / lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        try:
            holder = (workdir / pid).read_text().strip()
        except OSError:
            holder = "unknown"
        raise busy(holder) from None
    os.set_inheritable(fd, False)
    atomic_write(workdir / pid, f"{os.getpid()}\n".encode())
    return fd


# ----------------------------------------------------------------- command group


def new_token() -> str:
    return secrets.token_hex(16)


def record_command(workdir: Path, token: str, pgid: int | None, cg: Path | None = None) -> None:
    """Write the record before the launch (``pgid`` None: only the token is known yet) and again
    after it, so no moment exists when a running command is not recorded."""
    rec = {"pgid": pgid, "token": token, "cgroup": str(cg or "")}
    atomic_write(workdir / COMMAND_GROUP, json.dumps(rec).encode())


def recorded_cgroup(workdir: Path) -> Path | None:
    """The recorded run's cgroup, if it had one (a path under a cgroup v2 mount only)."""
    try:
        value = json.loads((workdir / COMMAND_GROUP).read_bytes()).get("cgroup")
    except (OSError, ValueError, AttributeError):
        return None
    mount = cgroup.mount_point()
    if not isinstance(value, str) or not value or mount is None:
        return None
    path = Path(value)
    if not path.name.startswith(cgroup.PREFIX) or mount not in path.parents:
        return None
    return path


def read_command(workdir: Path) -> tuple[int | None, str] | None:
    """The recorded (pgid, token), or None when there is no usable record."""
    try:
        rec = json.loads((workdir / COMMAND_GROUP).read_bytes())
        pgid, token = rec.get("pgid"), rec["token"]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    if not isinstance(token, str) or len(token) < 16:
        return None
    return (pgid if isinstance(pgid, int) and pgid > 1 else None), token


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, process group) from /proc/PID/stat; None if the process is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    fields = raw[raw.rfind(b")") + 2 :].split()
    return fields[0].decode(), int(fields[2])


def _carries(pid: int, entry: bytes) -> bool:
    try:
        return entry in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:  # gone, or not ours to read: not the command's
        return False


def _scan(pgid: int | None, token: str) -> tuple[set[int], set[int]]:
    """This user's live processes that carry ``token``, and the live members of group ``pgid``."""
    entry, me, uid = f"{TOKEN_ENV}={token}".encode(), os.getpid(), os.getuid()
    carriers, members = set(), set()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        pid = int(name)
        try:
            if os.stat(f"/proc/{pid}").st_uid != uid:
                continue
        except OSError:
            continue
        st = _stat(pid)
        if st is None or st[0] in ("Z", "X"):
            continue
        if st[1] == pgid:
            members.add(pid)
        if _carries(pid, entry):
            carriers.add(pid)
    return carriers, members


def _kill_pass(pgid: int | None, token: str, ours: bool) -> tuple[set[int], bool]:
    """SIGKILL the token's carriers, and the whole group while a carrier is in it (its members
    that dropped the token too: a group id cannot pass to another group while it has members).
    Returns what is still to die and whether the group was seen to be the command's."""
    carriers, members = _scan(pgid, token)
    if carriers & members:
        ours = True
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)  # type: ignore[arg-type]
    for pid in carriers:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    return carriers | (members if ours else set()), ours


def kill_command(workdir: Path) -> set[int]:
    """SIGKILL the recorded command's processes once, without waiting; the pids signalled."""
    cg = recorded_cgroup(workdir)
    in_cgroup = set(cgroup.procs(cg)) if cg is not None else set()
    if cg is not None:
        cgroup.kill(cg)
    rec = read_command(workdir)
    return in_cgroup | (set() if rec is None else _kill_pass(*rec, ours=False)[0])


def reap_command(workdir: Path, timeout_s: float = REAP_TIMEOUT_S) -> int:
    """Kill what is left of the recorded command, wait until it is gone, remove the record.

    Called right after the workdir lock is taken, before anything starts, and at a run's end.
    Returns how many processes were killed; raises CommandLingers (the record kept) if some
    are still alive at the deadline. A killed process that stays a zombie counts as gone.
    """
    rec = read_command(workdir)
    killed: set[int] = set()
    deadline = time.monotonic() + timeout_s
    cg = recorded_cgroup(workdir)
    if cg is not None:
        killed |= set(cgroup.procs(cg))
        if not cgroup.kill_and_wait(cg, timeout_s):
            raise CommandLingers(
                f"{workdir}: processes {sorted(cgroup.procs(cg))} of the previous command's "
                f"cgroup outlived SIGKILL for {timeout_s:g}s; not starting beside them"
            )
    ours = False
    while rec is not None:
        pending, ours = _kill_pass(*rec, ours=ours)
        if not pending:
            break
        killed |= pending
        if time.monotonic() > deadline:
            raise CommandLingers(
                f"{workdir}: processes {sorted(pending)} of the previous command outlived "
                f"SIGKILL for {timeout_s:g}s; not starting beside them"
            )
        time.sleep(0.02)
    (workdir / COMMAND_GROUP).unlink(missing_ok=True)
    return len(killed)
