"""What a job does with what any of its executors says, one host or a group's member alike: an
executor's warning is journalled (the same one, numbers aside, at most once a minute), a fault
is journalled (a lost lease with the evidence that tells a lapse under load from a real loss),
and an executor's clock that drifts from the console's by more than ``clock_skew_s`` over one
lease is alerted (a lease assumes the two agree to within it).

Found in the merge of the two message paths (issue 30): a group's members had neither. Their
warnings reached the log tail only, never the journal, and a member's drifting clock went
unnoticed while its leases assumed it kept pace.
"""

from __future__ import annotations

import re
import time

from console import clock
from console.fleet.detect import ClockPace
from console.fleet.link import ExecutorLink
from console.records.journal import Journal, Kind
from console.supervise.lease import JobLease, lapse_note
from console.supervise.live import Alert
from protocol.faults import FaultKind
from protocol.messages import Fault, Log, LogLevel

WARN_EVERY_S = 60.0
"""The same executor warning is journalled at most this often."""
WARNING_LEVELS = (LogLevel.WARNING, LogLevel.ERROR)
"""The executor's own warnings; a command's output lines (stdout, stderr) are never journalled."""


class Heard:
    """One job's executors' warnings and clocks, by host."""

    def __init__(
        self,
        job: str,
        *,
        journal: Journal,
        alert: Alert,
        lease: JobLease,
        lease_s: float,
        skew_s: float,
    ) -> None:
        self._job = job
        self._lease = lease
        """The job's lease: its evidence goes with a lost lease's fault."""
        self._journal = journal
        self._alert = alert
        self._lease_s = lease_s
        self._skew_s = skew_s
        self._journalled: dict[str, float] = {}
        """Each executor warning (numbers aside): when it was last journalled."""
        self._paces: dict[str, ClockPace] = {}

    def new_executor(self, host: str) -> None:
        """Another executor on ``host``, another clock: its pace is measured afresh."""
        self._paces.pop(host, None)

    def clock(self, host: str, executor_clock: float) -> None:
        """A heartbeat's clock reading from the executor on ``host``."""
        pace = self._paces.setdefault(host, ClockPace(self._lease_s))
        drift = pace.sample(executor_clock, clock.mono())
        if drift is not None and abs(drift) > self._skew_s:
            self._alert(
                f"{host}: its clock and the console's drifted {drift:+.2f} s apart over one "
                f"lease, more than clock_skew_s ({self._skew_s:g} s): leases may not hold; "
                "raise clock_skew_s or check the host's clock",
                host=host,
            )

    def log(self, host: str, msg: Log) -> None:
        """A Log line from the executor on ``host``: journalled if it is a fresh warning."""
        if msg.level not in WARNING_LEVELS or not self._fresh(msg.text):
            return
        self._journal.record(
            Kind.WARNING,
            f"{self._job} on {host}: {msg.text}",
            job=self._job,
            host=host,
            data={"level": msg.level},
        )

    def fault(self, host: str, msg: Fault, link: ExecutorLink | None, **extra: int | str) -> None:
        """A Fault from the executor on ``host`` (over ``link``), journalled with ``extra``."""
        text, data = f"{self._job} on {host}: {msg.fault}: {msg.message}", {}
        if msg.fault == FaultKind.LEASE_LOST:
            data = self._lease.evidence(host, link)
            text += f" ({lapse_note(data)})"
        self._journal.record(
            Kind.FAULT,
            text,
            job=self._job,
            host=host,
            data={"fault": msg.fault, "step": msg.step, **extra, **data},
        )

    def _fresh(self, text: str) -> bool:
        key = re.sub(r"\d+", "#", text)
        now = time.monotonic()
        if now - self._journalled.get(key, -WARN_EVERY_S) < WARN_EVERY_S:
            return False
        self._journalled[key] = now
        return True
