"""The kill program: SIGKILL the executor of a workdir by its recorded pid, never by a name
pattern, then reap the command group it recorded. Run on the host as
``python -c SOURCE WORKDIR TIMEOUT``; prints one JSON line (``pid``, ``holders``, ``reaped``,
``why``) and exits with one of the statuses below (``console.reach.remote.KillStatus``).

The pid in executor.pid is killed only if /proc/locks shows it holding the flock on that
workdir's executor.lock (same device and inode); then the run is reaped holding the lock, so
no new executor starts (and records a new group) meanwhile: the run's cgroup killed whole
where it has one, and every process carrying the run's token, with its process group while a
carrier is in it. The standard library only.
"""

from __future__ import annotations

import fcntl
import json
import os
import select
import signal
import sys
import time
from typing import Any

LOCK = "executor.lock"
PID = "executor.pid"
COMMAND_GROUP = "command.pgid"
TOKEN_ENV = "HOTSPARE_RUN_TOKEN"
CGROUP_PREFIX = "hotspare-run-"
"""``executors/agent/workdir.py``'s and ``executors/fencing/cgroup.py``'s names (a test compares)."""

KILLED, NOT_HELD, REFUSED, SURVIVED, LEFTOVERS = 0, 10, 11, 12, 13
ENDING_S = 2.0
"""With no executor.pid, how long the lock is given to be let go of (an executor ending
removes its pid file before its process lets go)."""
POLL_S = 0.02


class Done(Exception):
    def __init__(self, code: int, why: str) -> None:
        super().__init__(why)
        self.code, self.why = code, why


def stat(pid: int) -> tuple[bytes, int] | None:
    """(state, process group) from /proc; None once the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    fields = raw[raw.rfind(b")") + 2 :].split()
    return fields[0], int(fields[2])


def alive(pid: int) -> bool:
    st = stat(pid)
    return st is not None and st[0] not in (b"Z", b"X")


def holders(st: os.stat_result) -> set[int]:
    """Pids /proc/locks names as holding a FLOCK on this device and inode (waiters: "->")."""
    want, found = (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino), set()
    with open("/proc/locks") as f:
        for line in f:
            parts = line.split()
            if len(parts) < 6 or parts[1] != "FLOCK":
                continue
            try:
                major, minor, ino = parts[5].split(":")
                if (int(major, 16), int(minor, 16), int(ino)) == want:
                    found.add(int(parts[4]))
            except ValueError:
                continue
    return found


def scan(pgid: int | None, entry: bytes) -> tuple[set[int], set[int]]:
    """(processes of this user carrying ``entry`` in their environment, members of ``pgid``)."""
    carriers, members, me, uid = set(), set(), os.getpid(), os.getuid()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        pid = int(name)
        try:
            if os.stat(f"/proc/{pid}").st_uid != uid:
                continue
            st = stat(pid)
            if st is None or st[0] in (b"Z", b"X"):
                continue
            if st[1] == pgid:
                members.add(pid)
            with open(f"/proc/{pid}/environ", "rb") as f:
                if entry in f.read().split(b"\0"):
                    carriers.add(pid)
        except OSError:
            continue
    return carriers, members


def cgroup_mount() -> str | None:
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            if right.split()[:1] == ["cgroup2"]:
                return left.split()[4]
    return None


class Kill:
    def __init__(self, workdir: str, timeout: float) -> None:
        self.workdir = workdir
        self.deadline = time.monotonic() + timeout
        self.timeout = timeout
        self.lock_path = os.path.join(workdir, LOCK)
        self.out: dict[str, Any] = {"pid": None, "holders": [], "reaped": 0, "why": ""}

    def take_lock(self) -> int | None:
        fd = os.open(self.lock_path, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        return fd

    def kill_cgroup(self, cg: str, killed: set[int]) -> bool:
        """The run's cgroup killed whole and waited out; only a ``hotspare-run-*`` folder
        under the cgroup v2 mount is ever touched. False: still populated at the deadline."""
        mount = cgroup_mount()
        if mount is None or not os.path.basename(cg).startswith(CGROUP_PREFIX):
            return True
        if os.path.commonpath([mount, os.path.realpath(cg)]) != mount or not os.path.isdir(cg):
            return True
        while True:
            try:
                with open(os.path.join(cg, "cgroup.procs")) as f:
                    pids = [int(x) for x in f.read().split()]
                with open(os.path.join(cg, "cgroup.events")) as f:
                    populated = "populated 1" in f.read()
                with open(os.path.join(cg, "cgroup.kill"), "w") as f:
                    f.write("1")
            except OSError:  # gone (FileNotFoundError) or not ours to kill
                return True
            killed.update(pids)
            self.out["reaped"] = len(killed)
            if not populated:
                try:
                    os.rmdir(cg)
                except OSError:
                    pass
                return True
            if time.monotonic() > self.deadline:
                return False
            time.sleep(POLL_S)

    def reap(self) -> bool:
        """The run the executor recorded: its token's carriers, and the whole process group
        while a carrier is in it. False: something of it outlived SIGKILL to the deadline."""
        path = os.path.join(self.workdir, COMMAND_GROUP)
        try:
            with open(path, "rb") as f:
                rec = json.loads(f.read())
            pgid, token = rec.get("pgid"), rec["token"]
            if not isinstance(token, str) or len(token) < 16:
                raise ValueError(token)
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return True
        pgid = pgid if isinstance(pgid, int) and pgid > 1 else None
        entry, ours = (TOKEN_ENV + "=" + token).encode(), False
        killed: set[int] = set()
        cg = rec.get("cgroup")
        if isinstance(cg, str) and cg and not self.kill_cgroup(cg, killed):
            return False
        while True:
            carriers, members = scan(pgid, entry)
            if pgid is not None and carriers & members:
                ours = True
                try:
                    os.killpg(pgid, signal.SIGKILL)
                except OSError:
                    pass
            for pid in carriers:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            pending = carriers | (members if ours else set())
            killed |= pending
            self.out["reaped"] = len(killed)
            if not pending:
                os.unlink(path)
                return True
            if time.monotonic() > self.deadline:
                return False
            time.sleep(POLL_S)

    def reap_holding_lock(self) -> str:
        """Reaped holding the lock ('' once done; else why not)."""
        while True:
            fd = self.take_lock()
            if fd is not None:
                break
            if time.monotonic() > self.deadline:
                return "the lock stayed held after the kill; the command group was not reaped"
            time.sleep(POLL_S)
        try:
            return "" if self.reap() else "processes of the command group outlived SIGKILL"
        finally:
            os.close(fd)

    def free(self) -> None:
        """Nothing holds the lock: reap what the run left, and end (``NOT_HELD``)."""
        fd = self.take_lock()
        if fd is not None:
            try:
                left = "" if self.reap() else "processes of the command group outlived SIGKILL"
            finally:
                os.close(fd)
            raise Done(LEFTOVERS if left else NOT_HELD, left or "nothing holds the lock")

    def run(self) -> None:
        """Raises ``Done`` with the status and why."""
        try:
            lock_st = os.stat(self.lock_path)
        except FileNotFoundError:
            raise Done(NOT_HELD, "no executor.lock: no executor ran here") from None
        pid_file = os.path.join(self.workdir, PID)
        pid: int | None
        try:
            with open(pid_file) as f:
                self.out["pid"] = pid = int(f.read().strip())
        except (OSError, ValueError):
            pid = None
        self.free()
        if pid is None and not os.path.exists(pid_file):
            soon = min(self.deadline, time.monotonic() + ENDING_S)
            while time.monotonic() < soon:
                time.sleep(POLL_S)
                self.free()
        if pid is None or pid <= 1:
            raise Done(REFUSED, "the lock is held, but executor.pid names no process")
        pidfd = None
        try:
            if hasattr(os, "pidfd_open"):
                pidfd = os.pidfd_open(pid)  # this process, whatever reuses its number later
        except ProcessLookupError:
            raise Done(
                REFUSED, f"the lock is held, but pid {pid} of executor.pid is gone"
            ) from None
        except OSError:
            pidfd = None
        found = holders(lock_st)
        self.out["holders"] = sorted(found)
        if pid not in found:
            why = f"pid {pid} of executor.pid does not hold the lock (held by {sorted(found)})"
            raise Done(REFUSED, why)
        if pidfd is not None and hasattr(signal, "pidfd_send_signal"):
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
        while alive(pid):
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise Done(SURVIVED, f"pid {pid} still alive {self.timeout:g}s after SIGKILL")
            if pidfd is not None:
                select.select([pidfd], [], [], min(left, 0.1))
            else:
                time.sleep(POLL_S)
        leftovers = self.reap_holding_lock()
        raise Done(LEFTOVERS if leftovers else KILLED, leftovers or f"killed pid {pid}")


def main(argv: list[str]) -> int:
    """``WORKDIR TIMEOUT``: the status, its report printed as one JSON line."""
    kill = Kill(argv[0], float(argv[1]))
    try:
        kill.run()
    except Done as d:
        kill.out["why"] = d.why
        print(json.dumps(kill.out))
        return d.code
    raise AssertionError("run() ends with Done")  # pragma: no cover


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
