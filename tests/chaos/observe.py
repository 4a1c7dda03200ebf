"""What the chaos run watches: the console's journal, each executor's own events.jsonl, and
the processes themselves (a sampler thread over /proc: which executors of a job train now)."""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from console.records.incidents import Incident, incidents
from console.records.journal import Event, Kind, read

TRAIN_THREAD = "hotspare-train"
"""The OS name of an executor's training thread (executors/serve.py); idle executors have none."""
SAMPLE_S = 0.1


def journal(state_dir: Path) -> list[Event]:
    return list(read(state_dir / "journal.jsonl"))


@dataclass
class JobView:
    """One job as the journal tells it now."""

    state: str = "pending"
    host: str | None = None
    epoch: int = 0
    spares: list[str] = field(default_factory=list)
    running_since: float = 0.0
    finished: bool = False
    open_incidents: list[Incident] = field(default_factory=list)


def job_view(events: list[Event], job: str) -> JobView:
    v = JobView()
    for e in events:
        if e.job != job:
            continue
        if e.kind is Kind.JOB_STATE:
            v.state = e.data.get("to", v.state)
            if v.state == "running":
                v.host, v.epoch, v.running_since = e.host, e.data.get("epoch", 0), e.t
        elif e.kind is Kind.PLACEMENT and "spares" in e.data:
            v.spares = list(e.data["spares"])
        elif e.kind is Kind.FINISHED:
            v.finished = True
    v.open_incidents = [i for i in incidents(events) if i.job == job and not i.resolved]
    return v


def json_lines(data: bytes) -> list[dict[str, Any]]:
    """Every complete JSON line (a torn last line is left out)."""
    out = []
    for line in data.split(b"\n")[:-1]:
        with contextlib.suppress(ValueError):
            out.append(json.loads(line))
    return out


def executor_events(workdir: Path) -> list[dict[str, Any]]:
    """Every event in an executor's events.jsonl (all executors that ran there)."""
    try:
        return json_lines((workdir / "events.jsonl").read_bytes())
    except OSError:
        return []


def events_size(workdir: Path) -> int:
    try:
        return (workdir / "events.jsonl").stat().st_size
    except OSError:
        return 0


def last_step(workdir: Path) -> int:
    """The newest step an executor there reported (its progress lines), 0 if none."""
    try:
        with open(workdir / "events.jsonl", "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - 16384))
            tail = f.read().split(b"\n")
    except OSError:
        return 0
    for line in reversed(tail):
        if b'"progress"' in line or b'"resumed"' in line:
            with contextlib.suppress(ValueError):
                return int(json.loads(line)["step"])
    return 0


# ---------------------------------------------------------------- processes


def _threads(pid: int) -> list[str]:
    names = []
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):
                names.append(Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip())
    return names


def _state(pid: int) -> str:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "gone"
    return stat.rsplit(")", 1)[1].split()[0]


@dataclass
class Overlap:
    t: float
    job: str
    pids: list[tuple[int, str, str]]
    """(pid, workdir, process state) of every executor of the job training at that instant."""


class Sampler:
    """Polls /proc: for each job, the executor processes that have a training thread.

    Counted as training: a live process (stopped ones too: a SIGSTOPped trainer still holds
    a trainer that must be fenced) whose training thread exists. Two at one instant is a
    split brain."""

    def __init__(self, workdirs: dict[str, list[Path]]) -> None:
        self.workdirs = {job: [str(w) for w in ws] for job, ws in workdirs.items()}
        self.overlaps: list[Overlap] = []
        self.samples = 0
        self.max_training: dict[str, int] = {job: 0 for job in workdirs}
        self.seen_training: dict[str, set[int]] = {job: set() for job in workdirs}
        self._known: dict[int, tuple[str, str]] = {}
        """Executor pids (an executor never execs again); other pids are read each time, since a
        process read between fork and exec still shows its parent's command line."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-sampler", daemon=True)

    def start(self) -> Sampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _classify(self, pid: int) -> tuple[str, str] | None:
        """(job, workdir) of an executor process, None for any other process."""
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return None
        args = [a.decode(errors="replace") for a in argv]
        if "serve" not in args or "--workdir" not in args:
            return None
        i = args.index("--workdir")
        workdir = os.path.normpath(args[i + 1]) if i + 1 < len(args) else ""
        for job, dirs in self.workdirs.items():
            if workdir in dirs:
                return job, workdir
        return None

    def sample(self) -> None:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
        alive = set(pids)
        for gone in [p for p in self._known if p not in alive]:
            del self._known[gone]
        training: dict[str, list[tuple[int, str, str]]] = {}
        for pid in pids:
            who = self._known.get(pid) or self._classify(pid)
            if who is None:
                continue
            self._known[pid] = who
            state = _state(pid)
            if state in ("Z", "X", "gone") or TRAIN_THREAD[:15] not in _threads(pid):
                continue
            training.setdefault(who[0], []).append((pid, who[1], state))
        now = time.time()
        self.samples += 1
        for job, found in training.items():
            self.max_training[job] = max(self.max_training[job], len(found))
            self.seen_training[job].update(p for p, _, _ in found)
            if len(found) > 1:
                self.overlaps.append(Overlap(now, job, found))

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            self.sample()
