"""Requests that reach the step loop from outside it: signals, the console, the lease.

Set from any thread; the trainer reads them at step boundaries only.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class StopRequest:
    reason: str
    checkpoint: bool
    exit_code: int
    fault: str | None = None
    """A fault to report at the boundary (set from a signal handler, which must not emit)."""


class Control:
    def __init__(
        self, epoch: int = 0, lease_s: float = 0.0, lease_sent_at: float | None = None
    ) -> None:
        self._lock = threading.Lock()
        self._checkpoint_reason: str | None = None
        self._stop: StopRequest | None = None
        self.epoch = epoch
        self.lease_ttl_s = lease_s
        self.lease_deadline: float | None = None
        if lease_s > 0:
            left = (
                lease_s
                if lease_sent_at is None
                else min(lease_s, lease_sent_at + lease_s - time.time())
            )
            self.lease_deadline = time.monotonic() + left

    def request_checkpoint(self, reason: str) -> None:
        with self._lock:
            self._checkpoint_reason = reason

    def take_checkpoint_request(self) -> str | None:
        with self._lock:
            reason, self._checkpoint_reason = self._checkpoint_reason, None
            return reason

    def request_stop(
        self, reason: str, *, checkpoint: bool, exit_code: int, fault: str | None = None
    ) -> None:
        """The first stop request wins; a later one (say, a second signal) does not change it."""
        if self._stop is None:
            self._stop = StopRequest(reason, checkpoint, exit_code, fault)

    @property
    def stop(self) -> StopRequest | None:
        return self._stop

    def renew(self, epoch: int, ttl_s: float, sent_at: float | None = None) -> bool:
        """Extend the lease to ``sent_at + ttl_s`` (console clock); refused for another epoch or when stale."""
        with self._lock:
            if epoch != self.epoch:
                return False
            left = ttl_s if sent_at is None else min(ttl_s, sent_at + ttl_s - time.time())
            if left <= 0:
                return False
            self.lease_ttl_s = ttl_s
            self.lease_deadline = max(self.lease_deadline or 0.0, time.monotonic() + left)
            return True

    def lease_left(self) -> float | None:
        deadline = self.lease_deadline
        return None if deadline is None else deadline - time.monotonic()
