"""The processes of a run by the epoch it was started under, from /proc, trusting nothing the
console or an executor says: every process a command starts carries ``HOTSPARE_JOB`` and
``HOTSPARE_EPOCH`` in its environment (``executors.agent.run_env``), torchrun's workers included.

The invariant the fence keeps: once a process of epoch N of a job exists, no process of an
older epoch of that job does. ``EpochSampler`` samples every ``SAMPLE_S`` and reports each
sample where both were seen; ``seen`` tells whether it looked at all (a sampler that saw no
process of the job proves nothing).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field

SAMPLE_S = 0.05
_JOB, _EPOCH = b"HOTSPARE_JOB=", b"HOTSPARE_EPOCH="


def _alive(pid: str) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return False
    return raw[raw.rfind(b")") + 2 :].split()[0] not in (b"Z", b"X")


def run_processes(mark: bytes | None = None) -> dict[int, tuple[str, int]]:
    """Every live process that carries a job and an epoch: pid -> (job, epoch); with
    ``mark``, only those whose environment holds it."""
    found: dict[int, tuple[str, int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if mark is not None and not any(mark in e for e in env):
            continue
        job = next((e[len(_JOB) :] for e in env if e.startswith(_JOB)), None)
        epoch = next((e[len(_EPOCH) :] for e in env if e.startswith(_EPOCH)), None)
        if job is None or epoch is None or not epoch.isdigit() or not _alive(name):
            continue
        found[int(name)] = (job.decode(errors="replace"), int(epoch))
    return found


@dataclass(frozen=True)
class Stale:
    """A sample in which a process of an older epoch lived beside one of a newer epoch."""

    t: float
    job: str
    newest: int
    old: list[tuple[int, int]]
    """(pid, epoch) of each older epoch's process."""


@dataclass
class EpochSampler:
    jobs: set[str] | None = None
    """Only these jobs (None: every job)."""
    mark: bytes | None = None
    """Only processes whose environment holds this (None: all): a path of the test's own, in
    every executor's environment and so in every process of its runs. Other tests on the
    machine run jobs of the same names (chaos seed 11 of the second 60-fault torchrun run at
    0096bbd saw epochs 4 to 12 of another "j" beside its own epoch 3)."""
    seen: dict[tuple[str, int], set[int]] = field(default_factory=dict)
    """(job, epoch) -> every pid seen under it."""
    first: dict[tuple[str, int], float] = field(default_factory=dict)
    """(job, epoch) -> ``time.monotonic()`` of the sample it was first seen in."""
    stale: list[Stale] = field(default_factory=list)
    samples: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> EpochSampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> EpochSampler:
        self._thread = threading.Thread(target=self._loop, name="epoch-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop sampling (again: nothing more); what was seen stays."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)

    def _loop(self) -> None:
        newest: dict[str, int] = {}
        while not self._stop.is_set():
            t = time.monotonic()
            by_job: dict[str, list[tuple[int, int]]] = {}
            for pid, (job, epoch) in run_processes(self.mark).items():
                if self.jobs is not None and job not in self.jobs:
                    continue
                by_job.setdefault(job, []).append((pid, epoch))
                self.seen.setdefault((job, epoch), set()).add(pid)
                self.first.setdefault((job, epoch), t)
            for job, procs in by_job.items():
                top = max(newest.get(job, 0), *(e for _, e in procs))
                newest[job] = top
                old = [(p, e) for p, e in procs if e < top]
                if old:
                    self.stale.append(Stale(t, job, top, sorted(old)))
            self.samples += 1
            self._stop.wait(SAMPLE_S)
