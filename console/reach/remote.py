"""Small Python programs the console runs on a host with its own interpreter (args quoted, never spliced)."""

from __future__ import annotations

import json
import posixpath
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

import msgspec

from console.reach import replica_rules as rules
from console.reach.transport.base import PermanentTransportError, Transport
from protocol.spec import CheckpointManifest

_LIST = r"""
import glob, json, os, sys
out = []
for folder in sys.argv[1:]:
    found = []
    for p in sorted(glob.glob(os.path.join(folder, "step-*.json"))):
        if not os.path.exists(p[: -len(".json")] + ".pt"):
            continue  # a manifest whose data is gone is no checkpoint to load or promote
        stem = os.path.basename(p)[: -len(".json")]
        if os.path.exists(os.path.join(folder, "." + stem + ".pending")):
            continue  # its publish was never confirmed inside the lease (executors/publish.py)
        try:
            with open(p) as f:
                found.append(json.load(f))
        except (OSError, ValueError):
            pass
    out.append(found)
print(json.dumps(out))
"""

_PROMOTE = r"""
import glob, json, os, shutil, sys
src, dst, stem = sys.argv[1:4]


def files_of(manifest):
    # a folder checkpoint's files (each a safe path under it); None for a file checkpoint
    with open(manifest) as f:
        m = json.load(f)
    files = m.get("files")
    if files is None:
        return None
    listed = [(f["path"], f["size"], f["sha256"]) for f in files]
    why = check_files(listed, m["size"], m["sha256"])
    if why is not None:
        raise ValueError(why)
    return [p for p, _, _ in listed]


def link(a, b):
    try:
        os.link(a, b)
    except OSError:
        shutil.copyfile(a, b)


def place(name, paths):
    a, b = os.path.join(src, name + ".pt"), os.path.join(dst, name + ".pt")
    if paths is None:
        link(a, b)
    else:
        os.makedirs(b)
        for rel in paths:
            os.makedirs(os.path.dirname(os.path.join(b, rel)), exist_ok=True)
            link(os.path.join(a, rel), os.path.join(b, rel))
    link(os.path.join(src, name + ".json"), os.path.join(dst, name + ".json"))


# the chosen replica and every older one: if the newest turns out damaged, the executor's
# loader skips it for the one before, as with its own checkpoints. Every manifest is read
# before anything is written: a chosen one that names an unsafe path writes nothing.
chosen = []
for manifest in sorted(glob.glob(os.path.join(src, "step-*.json"))):
    name = os.path.basename(manifest)[: -len(".json")]
    if name > stem:
        continue
    if not os.path.exists(os.path.join(src, name + ".pt")):
        if name == stem:
            sys.exit("%s: its data is gone" % name)
        continue
    try:
        chosen.append((name, files_of(manifest)))
    except (OSError, ValueError, KeyError, TypeError) as e:
        if name == stem:
            sys.exit("%s: %s" % (name, e))
if stem not in [name for name, _ in chosen]:
    sys.exit("%s: no such replica in %s" % (stem, src))
shutil.rmtree(dst, ignore_errors=True)
os.makedirs(dst)
for name, paths in chosen:
    try:
        place(name, paths)
    except OSError:
        if name == stem:
            raise
        for ext in (".json", ".pt"):  # an older one damaged: left out, whatever it held
            p = os.path.join(dst, name + ext)
            if os.path.isdir(p):
                shutil.rmtree(p)
            elif os.path.lexists(p):
                os.unlink(p)
fd = os.open(dst, os.O_RDONLY)
os.fsync(fd)
"""

PROMOTE = Path(rules.__file__).read_text() + _PROMOTE
"""The promoting program: the replica rules' source (``check_files``), then ``_PROMOTE``."""

_LOCKED = r"""
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
except BlockingIOError:
    sys.exit(75)
"""

LOCK_HELD = 75

_KILL = r"""
import fcntl, json, os, select, signal, sys, time

workdir, timeout = sys.argv[1], float(sys.argv[2])
deadline = time.monotonic() + timeout
ENDING_S = 2.0
lock_path = os.path.join(workdir, "executor.lock")
out = {"pid": None, "holders": [], "reaped": 0, "why": ""}


def done(code, why):
    out["why"] = why
    print(json.dumps(out))
    sys.exit(code)


def stat(pid):
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            raw = f.read()
    except OSError:
        return None
    fields = raw[raw.rfind(b")") + 2 :].split()
    return fields[0], int(fields[2])


def alive(pid):
    st = stat(pid)
    return st is not None and st[0] not in (b"Z", b"X")


def holders(st):
    # pids /proc/locks names as holding a FLOCK on this device and inode (waiters have "->")
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


def take_lock():
    fd = os.open(lock_path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def scan(pgid, entry):
    carriers, members, me, uid = set(), set(), os.getpid(), os.getuid()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        pid = int(name)
        try:
            if os.stat("/proc/%d" % pid).st_uid != uid:
                continue
            st = stat(pid)
            if st is None or st[0] in (b"Z", b"X"):
                continue
            if st[1] == pgid:
                members.add(pid)
            with open("/proc/%d/environ" % pid, "rb") as f:
                if entry in f.read().split(b"\0"):
                    carriers.add(pid)
        except OSError:
            continue
    return carriers, members


def cgroup_mount():
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            if right.split()[:1] == ["cgroup2"]:
                return left.split()[4]
    return None


def kill_cgroup(cg, killed):
    # the run's cgroup (executors/fencing/cgroup.py: keep the two in step), killed whole and
    # waited out; only a hotspare-run-* folder under the cgroup v2 mount is ever touched
    mount = cgroup_mount()
    if mount is None or not os.path.basename(cg).startswith("hotspare-run-"):
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
        except FileNotFoundError:
            return True
        except OSError:
            return True
        killed.update(pids)
        out["reaped"] = len(killed)
        if not populated:
            try:
                os.rmdir(cg)
            except OSError:
                pass
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)


def reap():
    # the command group the executor recorded (executors/workdir.py: keep the two in step):
    # its token's carriers, and the whole group while a carrier is in it
    path = os.path.join(workdir, "command.pgid")
    try:
        with open(path, "rb") as f:
            rec = json.loads(f.read())
        pgid, token = rec.get("pgid"), rec["token"]
        if not isinstance(token, str) or len(token) < 16:
            raise ValueError(token)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return True
    pgid = pgid if isinstance(pgid, int) and pgid > 1 else None
    entry, ours, killed = ("HOTSPARE_RUN_TOKEN=" + token).encode(), False, set()
    cg = rec.get("cgroup")
    if isinstance(cg, str) and cg and not kill_cgroup(cg, killed):
        return False
    while True:
        carriers, members = scan(pgid, entry)
        if carriers & members:
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
        out["reaped"] = len(killed)
        if not pending:
            os.unlink(path)
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)


def reap_holding_lock():
    # holding the lock, no executor can start here (and record a new group) meanwhile
    while True:
        fd = take_lock()
        if fd is not None:
            break
        if time.monotonic() > deadline:
            return "the lock stayed held after the kill; the command group was not reaped"
        time.sleep(0.02)
    try:
        return "" if reap() else "processes of the command group outlived SIGKILL"
    finally:
        os.close(fd)


try:
    lock_st = os.stat(lock_path)
except FileNotFoundError:
    done(10, "no executor.lock: no executor ran here")
pid_file = os.path.join(workdir, "executor.pid")
try:
    with open(pid_file) as f:
        out["pid"] = pid = int(f.read().strip())
except (OSError, ValueError):
    pid = None


def free():
    fd = take_lock()
    if fd is not None:
        try:
            left = "" if reap() else "processes of the command group outlived SIGKILL"
        finally:
            os.close(fd)
        done(13 if left else 10, left or "nothing holds the lock")


free()
if pid is None and not os.path.exists(pid_file):
    # an executor on its way out removes executor.pid before it lets go of the lock
    soon = min(deadline, time.monotonic() + ENDING_S)
    while time.monotonic() < soon:
        time.sleep(0.02)
        free()
if pid is None or pid <= 1:
    done(11, "the lock is held, but executor.pid names no process")
pidfd = None
try:
    if hasattr(os, "pidfd_open"):
        pidfd = os.pidfd_open(pid)  # this process, whatever reuses its number later
except ProcessLookupError:
    done(11, "the lock is held, but pid %d of executor.pid is gone" % pid)
except OSError:
    pidfd = None
found = holders(lock_st)
out["holders"] = sorted(found)
if pid not in found:
    done(11, "pid %d of executor.pid does not hold the lock (held by %s)" % (pid, sorted(found)))
if pidfd is not None and hasattr(signal, "pidfd_send_signal"):
    signal.pidfd_send_signal(pidfd, signal.SIGKILL)
else:
    os.kill(pid, signal.SIGKILL)
while alive(pid):
    left = deadline - time.monotonic()
    if left <= 0:
        done(12, "pid %d still alive %gs after SIGKILL" % (pid, timeout))
    if pidfd is not None:
        select.select([pidfd], [], [], min(left, 0.1))
    else:
        time.sleep(0.02)
left = reap_holding_lock()
done(13 if left else 0, left or "killed pid %d" % pid)
"""


class KillStatus(Enum):
    """How ``kill_executor`` ended, by the remote program's exit status."""

    KILLED = 0
    """The pid in executor.pid held the workdir's lock; it was SIGKILLed and is gone."""
    NOT_HELD = 10
    """Nothing held the lock: no executor to kill (its command group was reaped all the same)."""
    REFUSED = 11
    """executor.pid names no process that holds the lock: nothing was killed. With no
    executor.pid at all, the lock is first given 2 s to be let go of (an executor ending
    removes its pid file before its process lets go), then NOT_HELD."""
    SURVIVED = 12
    """SIGKILL was sent, yet the pid was still alive at the deadline (stuck in the kernel?)."""
    LEFTOVERS = 13
    """The executor is gone, but its command group was not reaped in time."""


@dataclass(frozen=True)
class KillResult:
    status: KillStatus
    pid: int | None
    """What executor.pid said."""
    holders: list[int]
    """The pids /proc/locks named as holding the lock."""
    reaped: int
    """Processes of the recorded command group killed."""
    why: str


async def list_manifests(
    t: Transport, python: str, folder: str, *, timeout: float = 30
) -> list[CheckpointManifest]:
    """The complete checkpoints (manifests) in a folder on the host, oldest first."""
    return (await list_manifests_in(t, python, [folder], timeout=timeout))[folder]


async def list_manifests_in(
    t: Transport, python: str, folders: list[str], *, timeout: float = 30
) -> dict[str, list[CheckpointManifest]]:
    """The complete checkpoints in each of these folders on the host, oldest first: one
    remote program for all of them."""
    result = await t.run([python, "-c", _LIST, *folders], timeout=timeout)
    if result.returncode != 0:
        raise PermanentTransportError(
            f"{t.name}: listing {', '.join(folders)} failed: {result.stderr.strip()[-200:]}"
        )
    listed = json.loads(result.stdout or "[]")
    out: dict[str, list[CheckpointManifest]] = {}
    for folder, items in zip(folders, listed, strict=True):
        found = []
        for item in items:
            try:
                m = msgspec.convert(item, CheckpointManifest)
            except msgspec.ValidationError:
                continue
            if sound(m):
                found.append(m)
        out[folder] = sorted(found, key=lambda m: m.step)
    return out


def sound(m: CheckpointManifest) -> bool:
    """A manifest whose folder's files (if any) are paths under it that add up to its size
    and sha256: one to copy or promote (a host's word is no path to read or write)."""
    if m.files is None:
        return True
    files = [(f.path, f.size, f.sha256) for f in m.files]
    return rules.check_files(files, m.size, m.sha256) is None


async def promote(
    t: Transport,
    python: str,
    replica_folder: str,
    checkpoints: str,
    step: int,
    *,
    timeout: float = 60,
) -> None:
    """Make one replica (and the older ones kept beside it) an executor's checkpoints: a
    folder's files each linked by the path its manifest lists, once every path is checked."""
    stem = f"step-{step:010d}"
    result = await t.run(
        [python, "-c", PROMOTE, replica_folder, checkpoints, stem], timeout=timeout
    )
    if result.returncode != 0:
        raise PermanentTransportError(
            f"{t.name}: promoting replica {stem} failed: {result.stderr.strip()[-200:]}"
        )


async def kill_executor(
    t: Transport, python: str, workdir: str, *, timeout: float = 10
) -> KillResult:
    """SIGKILL the executor of ``workdir`` by its recorded pid, never by a name pattern.

    The pid in executor.pid is killed only if /proc/locks shows it holding the flock on that
    workdir's executor.lock (same device and inode); then the command group it recorded is
    reaped, holding the lock so no new executor starts meanwhile. ``timeout`` bounds the
    waits on the host; a status the program does not know is a PermanentTransportError.
    """
    result = await t.run([python, "-c", _KILL, workdir, str(timeout)], timeout=timeout + 20)
    try:
        status = KillStatus(result.returncode)
        report = json.loads(result.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise PermanentTransportError(
            f"{t.name}: killing the executor of {workdir} failed (exit {result.returncode}): "
            f"{result.stderr.strip()[-300:]}"
        ) from None
    return KillResult(
        status, report.get("pid"), report.get("holders", []), report.get("reaped", 0), report["why"]
    )


async def executor_alive(t: Transport, python: str, workdir: str, *, timeout: float = 10) -> bool:
    """Does a live executor hold the workdir's lock? (The kernel drops it when the process dies.)"""
    result = await t.run(
        [python, "-c", _LOCKED, posixpath.join(workdir, "executor.lock")], timeout=timeout
    )
    return result.returncode == LOCK_HELD
