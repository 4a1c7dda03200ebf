"""The lease bounds a console persisted, read from its ``state.json`` as it writes them, on the
wall clock a /proc sampler uses (``chaos.procs.Sampler``), so a test can compare when an
executor trained with the documented bound instead of the console's own account.

The console writes each lease's bound (``until``, its CLOCK_BOOTTIME) to ``state.json`` before
it sends the lease; a failover overwrites it with the new epoch's. ``LeaseBounds`` polls the
file every ``POLL_S`` and keeps the largest bound seen per (job, host, epoch).
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from console import clock
from console.supervise.lease import PERSIST_AHEAD

POLL_S = 0.02


class LeaseBounds:
    def __init__(self, state_json: Path) -> None:
        self.path = state_json
        self.until: dict[tuple[str, str, int], float] = {}
        """(job, host, epoch) -> the largest persisted bound, on the console's clock."""
        self.seen: list[tuple[float, str, int, float]] = []
        """(wall time read, job, epoch, bound on the console's clock), each new bound once."""
        self.reads = 0
        self._offset = time.time() - clock.mono()
        """Wall clock minus the console's clock, read once (nothing steps the wall clock here)."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lease-bounds", daemon=True)

    def start(self) -> LeaseBounds:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def __enter__(self) -> LeaseBounds:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        while not self._stop.wait(POLL_S):
            try:
                jobs = json.loads(self.path.read_text()).get("jobs", {})
            except (OSError, ValueError):
                continue
            self.reads += 1
            now = time.time()
            for name, rec in jobs.items():
                lease = rec.get("lease") if isinstance(rec, dict) else None
                if lease:
                    key = (name, lease["host"], lease["epoch"])
                    if lease["until"] > self.until.get(key, 0.0):
                        self.until[key] = lease["until"]
                        self.seen.append((now, name, lease["epoch"], lease["until"]))

    def wall(self, job: str, host: str, epoch: int) -> float:
        """The bound on (job, host, epoch)'s leases on the wall clock; KeyError if never seen."""
        return self.until[(job, host, epoch)] + self._offset

    def persisted(self, job: str, epoch: int, by: float | None = None) -> float | None:
        """The largest bound persisted for the job's epoch, on the wall clock: no lease of that
        epoch granted before then runs past it. ``by``: as read from disk by that wall time
        (a group's members share one record, which survivors' renewals raise after a member
        was lost). None if none was seen."""
        found = [
            u
            for t, j, e, u in list(self.seen)
            if (j, e) == (job, epoch) and (by is None or t <= by)
        ]
        return max(found) + self._offset if found else None

    def granted_end(
        self, job: str, epoch: int, lease_s: float, by: float | None = None
    ) -> float | None:
        """The end of the newest lease of the job's epoch the console granted (by ``by``), on
        the wall clock, at the least: ``persisted`` less the lead the console writes it with
        (``PERSIST_AHEAD`` of a lease). The console's own failover waits at least this plus
        ``clock_skew_s``; a console started later waits the bound itself."""
        bound = self.persisted(job, epoch, by)
        return None if bound is None else bound - lease_s * PERSIST_AHEAD
