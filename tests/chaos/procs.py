"""The processes themselves, from /proc, trusting nothing the console or an executor says:
which executors of a job *train* (their training thread burns CPU) between two samples.

Every host of the bed runs on this machine (network namespaces, one pid namespace), so
/proc sees every executor there is. An executor is known by its command line (``serve
--workdir W``, W a workdir of a job; a torch job's local rank above 0 by its ``rank_process
--workdir W --local-rank K``); its training thread by its OS name. A thread is
counted as training in the window between two samples when its CPU time (utime + stime in
/proc/PID/task/TID/stat) grew in that window: a SIGSTOPped trainer, or one parked after its
lease, holds a thread that does not train. Those are counted apart (``frozen``): present
beside a newer trainer is no split brain unless they train again, which the windows show.
A process continued after a stop finishes the step it was frozen in before it can look at
its lease: its CPU in the first ``THAW_S`` after it was last seen stopped is kept apart
(``thawed``), not counted as training; any after that is.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

FOLLOWER = "executors.kinds.torch.rank_process"
"""A torch job's local rank above 0 (``--workdir W --local-rank K``): its own trainer, which
may train beside local rank 0 of its executor (``job/local-K`` here), never beside another
process of the same local rank."""


TRAIN_THREAD = "hotspare-train"
"""The OS name of an executor's training thread (executors/agent/serve.py); idle executors have none."""
SAMPLE_S = 0.1
THAW_S = 0.5
"""A continued executor's step in flight, its lease check and its exit: a tiny model's step
takes milliseconds and the lease watchdog looks every 50 ms."""


@dataclass(frozen=True)
class Window:
    """(t0, t1]: the span between two samples in which a thread's CPU time grew."""

    t0: float
    t1: float


@dataclass
class Trainer:
    """One executor process of a job, as /proc showed it."""

    pid: int
    job: str
    workdir: str
    windows: list[Window] = field(default_factory=list)
    """Every window in which its training thread trained, oldest first."""


@dataclass
class Overlap:
    """A window in which more than one process of one job trained."""

    t0: float
    t1: float
    job: str
    pids: list[tuple[int, str]]
    """(pid, workdir) of every process of the job that trained in the window."""
    index: int
    """The sample's number: consecutive windows make one interval."""


def _train_threads(pid: int) -> list[tuple[int, int]]:
    """(tid, CPU ticks so far) of each training thread of ``pid``; [] when gone or none."""
    out = []
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                task = f"/proc/{pid}/task/{tid}"
                if Path(f"{task}/comm").read_text().strip() != TRAIN_THREAD[:15]:
                    continue
                fields = Path(f"{task}/stat").read_text().rsplit(")", 1)[1].split()
                out.append((int(tid), int(fields[11]) + int(fields[12])))  # utime + stime
    return out


def _state(pid: int) -> str:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "gone"
    return stat.rsplit(")", 1)[1].split()[0]


def followers_in(workdir: Path) -> list[int]:
    """Pids of the live followers training in ``workdir``, from their command lines."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or _state(int(name)) in ("Z", "X", "gone"):
            continue
        with contextlib.suppress(OSError):
            args = Path(f"/proc/{name}/cmdline").read_bytes().decode(errors="replace").split("\0")
            if FOLLOWER in args and str(workdir) in args:
                found.append(int(name))
    return found


class Sampler:
    """Polls /proc: for each job, the executor processes whose training thread trained since
    the sample before. Two in one window is two trainers at once."""

    def __init__(self, workdirs: dict[str, list[Path]]) -> None:
        self.workdirs = {job: [str(w) for w in ws] for job, ws in workdirs.items()}
        self.overlaps: list[Overlap] = []
        self.frozen: list[Overlap] = []
        """Windows in which a job had a trainer and another process holding a training thread
        that did not train (stopped, or parked): allowed, and reported."""
        self.thawed: list[tuple[int, str, Window]] = []
        """(pid, job, window) of CPU a continued process spent right after a stop."""
        self.samples = 0
        self.trainers: dict[int, Trainer] = {}
        """Every executor process ever seen training, by pid (pids are not reused this fast)."""
        self._known: dict[int, tuple[str, str]] = {}
        """Executor pids (an executor never execs again); other pids are read each time, since a
        process read between fork and exec still shows its parent's command line."""
        self._cpu: dict[tuple[int, int], int] = {}
        self._stopped_at: dict[int, float] = {}
        """When each pid was last seen stopped (state T or t)."""
        self._last = time.time()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-sampler", daemon=True)

    def start(self) -> Sampler:
        self._last = time.time()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def seen_training(self, job: str) -> set[int]:
        return {p for p, t in self.trainers.items() if t.job == job and t.windows}

    def windows(self, workdir: Path) -> list[Window]:
        """Every window in which an executor of ``workdir`` trained, oldest first."""
        where = os.path.normpath(workdir)
        return sorted(
            (w for t in list(self.trainers.values()) if t.workdir == where for w in t.windows),
            key=lambda w: w.t0,
        )

    def _classify(self, pid: int) -> tuple[str, str] | None:
        """(job, workdir) of an executor process, None for any other process."""
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return None
        args = [a.decode(errors="replace") for a in argv]
        follower = FOLLOWER in args
        if ("serve" not in args and not follower) or "--workdir" not in args:
            return None
        i = args.index("--workdir")
        workdir = os.path.normpath(args[i + 1]) if i + 1 < len(args) else ""
        local = ""
        if follower and "--local-rank" in args[:-1]:
            local = f"/local-{args[args.index('--local-rank') + 1]}"
        for job, dirs in self.workdirs.items():
            if workdir in dirs:
                return job + local, workdir
        return None

    def sample(self) -> None:
        t0, t1 = self._last, time.time()
        self._last = t1
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
        alive = set(pids)
        for gone in [p for p in self._known if p not in alive]:
            del self._known[gone]
        trained: dict[str, list[tuple[int, str]]] = {}
        holding: dict[str, list[tuple[int, str]]] = {}
        for pid in pids:
            who = self._known.get(pid) or self._classify(pid)
            if who is None:
                continue
            self._known[pid] = who
            state = _state(pid)
            if state in ("Z", "X", "gone"):
                continue
            if state in ("T", "t"):
                self._stopped_at[pid] = t1
            threads = _train_threads(pid)
            if not threads:
                continue
            holding.setdefault(who[0], []).append((pid, who[1]))
            grew = False
            for tid, cpu in threads:
                grew |= cpu > self._cpu.get((pid, tid), 0)
                self._cpu[(pid, tid)] = cpu
            if grew and t0 - self._stopped_at.get(pid, -THAW_S) < THAW_S:
                self.thawed.append((pid, who[0], Window(t0, t1)))
            elif grew:
                trained.setdefault(who[0], []).append((pid, who[1]))
                trainer = self.trainers.setdefault(pid, Trainer(pid, who[0], who[1]))
                trainer.windows.append(Window(t0, t1))
        self.samples += 1
        for job, found in trained.items():
            if len(found) > 1:
                self.overlaps.append(Overlap(t0, t1, job, found, self.samples))
            elif len(holding.get(job, [])) > 1:
                self.frozen.append(Overlap(t0, t1, job, holding[job], self.samples))

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            self.sample()
