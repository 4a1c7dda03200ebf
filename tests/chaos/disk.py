"""Every checkpoint published on any host's disk, and every line an executor wrote, as a
watcher thread saw them appear: the record the fencing checks read instead of the journal.

A checkpoint is *published* when its manifest (``step-N.json``) appears, by rename, in an
executor's ``jobs/JOB/checkpoints`` (a primary) or the console's ``replicas/JOB`` (a replica);
the manifest names the epoch that wrote it and the kernel stamps the file's mtime, which
no writer chooses. A failover promotes replicas into the new host's checkpoints as hard
links: a primary that shares its inode with a replica seen before is a promoted copy, not
a write. A multi-host job replicates each member's shard to a folder of its own
(``replicas/JOB/node-R``), scanned as replicas too. Executors' events.jsonl carry no times, so each line is stamped when first seen
(at most one scan late: an upper bound on when it was written).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SCAN_S = 0.1


@dataclass(frozen=True)
class Manifest:
    host: str
    job: str
    replica: bool
    path: str
    ino: int
    mtime: float
    seen: float
    epoch: int
    step: int
    sha256: str
    created_at: float
    node_rank: int | None = None
    """The shard's node rank (a multi-host job's member); None for a single host."""


@dataclass(frozen=True)
class Line:
    """One line of an executor's events.jsonl, and when it was first seen."""

    seen: float
    host: str
    job: str
    event: dict[str, Any]


class DiskWatch:
    def __init__(self, roots: dict[str, Path], jobs: list[str]) -> None:
        self.roots = roots
        self.jobs = jobs
        self.manifests: list[Manifest] = []
        self.lines: list[Line] = []
        self._seen: set[tuple[str, int, int]] = set()
        self._offsets: dict[Path, int] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-disk", daemon=True)

    def start(self) -> DiskWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.scan()  # what appeared since the last scan

    def lines_of(self, host: str, job: str, since: float = 0.0) -> list[Line]:
        with self._lock:
            return [
                ln for ln in self.lines if ln.host == host and ln.job == job and ln.seen >= since
            ]

    def replica_inodes(self) -> set[tuple[str, int]]:
        return {(m.host, m.ino) for m in self.manifests if m.replica}

    def scan(self) -> None:
        for host, root in self.roots.items():
            for job in self.jobs:
                self._manifests(host, job, root / "jobs" / job / "checkpoints", replica=False)
                self._manifests(host, job, root / "replicas" / job, replica=True)
                for shard in _shard_folders(root / "replicas" / job):
                    self._manifests(host, job, shard, replica=True)
                self._lines(host, job, root / "jobs" / job / "events.jsonl")

    def _manifests(self, host: str, job: str, folder: Path, *, replica: bool) -> None:
        try:
            entries = list(os.scandir(folder))
        except OSError:
            return
        now = time.time()
        for entry in entries:
            if not (entry.name.startswith("step-") and entry.name.endswith(".json")):
                continue
            try:
                st = entry.stat()
                key = (entry.path, st.st_ino, st.st_mtime_ns)
                if key in self._seen:
                    continue
                m = json.loads(Path(entry.path).read_bytes())
            except (OSError, ValueError):
                continue  # purged meanwhile, or not whole yet (written by rename: not expected)
            self._seen.add(key)
            with self._lock:
                self.manifests.append(
                    Manifest(
                        host,
                        job,
                        replica,
                        entry.path,
                        st.st_ino,
                        st.st_mtime_ns / 1e9,
                        now,
                        int(m.get("epoch", 0)),
                        int(m.get("step", -1)),
                        str(m.get("sha256", "")),
                        float(m.get("created_at", 0.0)),
                        None if m.get("node_rank") is None else int(m["node_rank"]),
                    )
                )

    def _lines(self, host: str, job: str, path: Path) -> None:
        at = self._offsets.get(path, 0)
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size < at:
                    at = 0  # the workdir was made again
                f.seek(at)
                data = f.read()
        except OSError:
            return
        end = data.rfind(b"\n") + 1
        self._offsets[path] = at + end
        now = time.time()
        with self._lock:
            for raw in data[:end].split(b"\n")[:-1]:
                with contextlib.suppress(ValueError):
                    self.lines.append(Line(now, host, job, json.loads(raw)))

    def _run(self) -> None:
        while not self._stop.wait(SCAN_S):
            self.scan()


def _shard_folders(folder: Path) -> list[Path]:
    """A multi-host job's replica folders, one per node rank (``node-R``)."""
    try:
        return [Path(e.path) for e in os.scandir(folder) if e.name.startswith("node-")]
    except OSError:
        return []
