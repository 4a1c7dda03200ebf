"""What a job does with what any of its executors says, one host or a group's member alike: an
executor's warning is journalled (the same one, numbers aside, at most once a minute), and an
executor's clock that drifts from the console's by more than ``clock_skew_s`` over one lease is
alerted (a lease assumes the two agree to within it).

Found in the merge of the two message paths (issue 30): a group's members had neither. Their
warnings reached the log tail only, never the journal, and a member's drifting clock went
unnoticed while its leases assumed it kept pace.
"""

from __future__ import annotations

import re
import time

from console import clock
from console.fleet.detect import ClockPace
from console.records.journal import Journal, Kind
from console.supervise.live import Alert
from protocol.messages import Log, LogLevel

WARN_EVERY_S = 60.0
"""The same executor warning is journalled at most this often."""
WARNING_LEVELS = (LogLevel.WARNING, LogLevel.ERROR)
"""The executor's own warnings; a command's output lines (stdout, stderr) are never journalled."""


class Heard:
    """One job's executors' warnings and clocks, by host."""

    def __init__(
        self, job: str, *, journal: Journal, alert: Alert, lease_s: float, skew_s: float
    ) -> None:
        self._job = job
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

    def _fresh(self, text: str) -> bool:
        key = re.sub(r"\d+", "#", text)
        now = time.monotonic()
        if now - self._journalled.get(key, -WARN_EVERY_S) < WARN_EVERY_S:
            return False
        self._journalled[key] = now
        return True
