"""The fence: a tiny process per run that outlives its executor and ends the whole run.

The executor starts it (``executors.fencing.run``) with a pipe as its standard input; the
fence starts the command as its child (or, ``--watch``, only watches a cgroup that a run forked
by the zygote joins). It is a child subreaper (``PR_SET_CHILD_SUBREAPER``), so every process
the run starts stays its descendant whatever session it moves to, and with ``--cgroup`` every
such process is also in the run's cgroup. It ends every one of them, then itself, when:

- the lease it holds ends (lines ``lease DEADLINE`` on the pipe, the executor's CLOCK_BOOTTIME;
  ``lease none``: fencing off), even if the executor is frozen;
- the pipe reaches its end without ``kill`` first: the executor is gone (SIGKILL, OOM killer,
  a crash), and a run without its executor is a run nobody fences;
- the executor says ``kill`` (the run's end, a stop past its grace);
- the command, its child, ends: whatever it left behind goes with it.

It exits the way the command did (its code, or the same signal), so the executor reads the
command's end from the fence's. Each end is one JSON line appended to ``--report``. No torch,
no threads: only the standard library and ``cgroup``, so it starts in milliseconds and is
never the process the OOM killer or a stuck import takes down first.

Usage: ``python -I -S fence.py [--cgroup PATH] [--report PATH] (--watch | -- ARGV...)``
"""

from __future__ import annotations

import ctypes
import json
import os
import select
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from pathlib import Path

from executors.fencing import cgroup

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
POLL_S = 0.5
FIRST_LEASE_S = 10.0
"""How long the fence waits for the executor's first lease line (written as it starts it)."""
_CLOCK = getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC)
"""The executor's lease clock (``executors.clock``): the deadline means the same here."""


def _prctl(option: int, arg: int) -> bool:
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(option, arg, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def die_with_parent(parent: int) -> bool:
    """This process is SIGKILLed when the thread that started it ends (its parent-death signal);
    False when its parent is not ``parent`` any more (it died before the signal was set)."""
    _prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL))
    return os.getppid() == parent


def children_of(root: int) -> set[int]:
    """Every live descendant of ``root`` (zombies left out), from /proc."""
    kids: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                raw = f.read()
        except OSError:
            continue
        fields = raw[raw.rfind(b")") + 2 :].split()
        if fields[0] in (b"Z", b"X"):
            continue
        kids.setdefault(int(fields[1]), []).append(int(name))
    found: set[int] = set()
    todo = [root]
    while todo:
        for kid in kids.get(todo.pop(), []):
            if kid not in found:
                found.add(kid)
                todo.append(kid)
    return found


class Fence:
    def __init__(self, cg: Path | None, report: str | None) -> None:
        self.cg, self.report = cg, report
        self.child: int | None = None
        self.status: int | None = None
        """The command's wait status once it has ended."""
        self.deadline: float | None = None
        self.leased = False
        """A lease line (a deadline, or ``none``) has been read."""
        self._buf = b""

    # -------------------------------------------------------------- the run

    def start(self, argv: list[str]) -> None:
        """Fork the command: in the cgroup before it runs a line of its own, stdin closed,
        signals as a fresh process has them, killed if this fence dies."""
        go_r, go_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(go_w)
                null = os.open(os.devnull, os.O_RDONLY)
                os.dup2(null, 0)
                os.close(null)
                for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD):
                    signal.signal(sig, signal.SIG_DFL)
                for sig in (signal.SIGPIPE, signal.SIGXFSZ):
                    signal.signal(sig, signal.SIG_DFL)
                signal.set_wakeup_fd(-1)
                _prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL))
                if os.read(go_r, 1) != b"1" or os.getppid() != self_pid:
                    os._exit(137)
                os.close(go_r)
                os.execvp(argv[0], argv)
            except OSError as e:
                os.write(2, f"hotspare: cannot run {argv[0]!r}: {e.strerror}\n".encode())
                os._exit(127)
            os._exit(127)
        os.close(go_r)
        self.child = pid
        if self.cg is not None:
            try:
                cgroup.join(self.cg, pid)
            except OSError as e:
                self.note(f"the run's cgroup refused it ({e.strerror}); the fence alone holds it")
                cgroup.remove(self.cg)
                self.cg = None
        os.write(go_w, b"1")
        os.close(go_w)

    def reap(self, block: bool = False) -> None:
        """Collect every child that has ended (orphans of the run come to a subreaper);
        ``block``: every child, waiting (when none is alive: only zombies are left)."""
        while True:
            try:
                pid, status = os.waitpid(-1, 0 if block else os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == self.child and self.status is None:
                self.status = status

    def end(self, why: str) -> None:
        """Every process of the run SIGKILLed and reaped, the cgroup removed; then exit as the
        command did."""
        killed: set[int] = set()
        deadline = time.monotonic() + cgroup.KILL_TIMEOUT_S
        me = os.getpid()
        while True:
            if self.cg is not None:
                cgroup.kill(self.cg)
            alive = children_of(me)
            if self.cg is not None:
                alive |= set(cgroup.procs(self.cg))
            for pid in alive:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            killed |= alive
            self.reap()
            if not alive and not (self.cg is not None and cgroup.populated(self.cg)):
                break
            if time.monotonic() > deadline:
                why += f"; {sorted(alive)} outlived SIGKILL"
                break
            time.sleep(0.01)
        if not alive:
            self.reap(block=True)  # the zombies the last pass made
        if self.cg is not None:
            cgroup.remove(self.cg)
        ran = self.child is not None
        killed.discard(self.child or -1)
        self.note(why, killed=len(killed))
        if not ran or self.status is None:
            os._exit(137)
        if os.WIFSIGNALED(self.status):
            sig = os.WTERMSIG(self.status)
            if sig not in (signal.SIGKILL, signal.SIGSTOP):
                signal.signal(sig, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
            os.kill(me, sig)
        os._exit(os.waitstatus_to_exitcode(self.status) & 0xFF)

    def note(self, why: str, **more: object) -> None:
        if self.report is None:
            return
        line = {"fence": os.getpid(), "why": why, "cgroup": str(self.cg or ""), **more}
        try:
            with open(self.report, "a") as f:
                f.write(json.dumps(line) + "\n")
        except OSError:
            pass

    # ------------------------------------------------------------- the pipe

    def take(self, data: bytes) -> str | None:
        """Orders from the executor; why to end, if one says so."""
        self._buf += data
        *lines, self._buf = self._buf.split(b"\n")
        for line in lines:
            word, _, arg = line.decode(errors="replace").strip().partition(" ")
            if word == "lease":
                try:
                    self.deadline = None if arg == "none" else float(arg)
                except ValueError:
                    pass
                else:
                    self.leased = True
            elif word == "kill":
                return "the executor ended the run"
        return None

    def first_lease(self) -> None:
        """The lease the executor sends at once, read before the command is started: a run
        whose lease has already ended (or that its executor ended meanwhile) never starts."""
        end = time.monotonic() + FIRST_LEASE_S
        while not self.leased:
            left = end - time.monotonic()
            ready = select.select([0], [], [], max(0.0, left))[0] if left > 0 else []
            if not ready:
                self._exit_unstarted("no lease from the executor before the command's start")
            data = os.read(0, 4096)
            if not data:
                self._exit_unstarted("the executor is gone (its pipe closed without an order)")
            why = self.take(data)
            if why is not None:
                self._exit_unstarted(why)
        if self.deadline is not None and time.clock_gettime(_CLOCK) >= self.deadline:
            self._exit_unstarted("the lease ended before the command started")

    def _exit_unstarted(self, why: str) -> None:
        self.note(why, killed=0, started=False)
        if self.cg is not None:
            cgroup.remove(self.cg)
        os._exit(137)

    def serve(self, wake: int) -> None:
        while True:
            self.reap()
            if self.child is not None and self.status is not None:
                self.end("the command ended")
            now = time.clock_gettime(_CLOCK)
            if self.deadline is not None and now >= self.deadline:
                self.end("the lease ended without renewal")
            timeout = POLL_S if self.deadline is None else min(POLL_S, self.deadline - now)
            try:
                ready, _, _ = select.select([0, wake], [], [], max(0.0, timeout))
            except InterruptedError:
                continue
            if wake in ready:
                os.read(wake, 512)
            if 0 in ready:
                data = os.read(0, 4096)
                if not data:
                    self.end("the executor is gone (its pipe closed without an order)")
                why = self.take(data)
                if why is not None:
                    self.end(why)


def main(args: list[str]) -> None:
    cg = report = None
    watch = False
    argv: list[str] = []
    while args:
        a = args.pop(0)
        if a == "--cgroup":
            value = args.pop(0)
            cg = Path(value) if value else None
        elif a == "--report":
            report = args.pop(0)
        elif a == "--watch":
            watch = True
        elif a == "--":
            argv = args
            break
        else:
            sys.exit(f"hotspare fence: unknown argument {a!r}")
    if not watch and not argv:
        sys.exit("hotspare fence: no command to run")
    if not _prctl(PR_SET_CHILD_SUBREAPER, 1):
        sys.exit("hotspare fence: PR_SET_CHILD_SUBREAPER refused")
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: None)  # a stop for the command's group is not for us
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w)
    fence = Fence(cg, report)
    if not watch:
        fence.first_lease()
        fence.start(argv)
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)  # the command's output pipes end when the command's processes do
        os.dup2(null, 2)
        os.close(null)
    fence.serve(wake_r)


self_pid = os.getpid()

if __name__ == "__main__":
    main(sys.argv[1:])
