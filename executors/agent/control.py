"""Requests that reach the step loop from outside it: signals, the console, the lease.

Set from any thread; the trainer reads them at step boundaries only.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from executors import clock
from protocol.faults import FaultKind, StopReason
from protocol.messages import Rendezvous


@dataclass(frozen=True)
class StopRequest:
    reason: StopReason
    checkpoint: bool
    exit_code: int
    fault: FaultKind | None = None
    """A fault to report at the boundary (set from a signal handler, which must not emit)."""


class Control:
    def __init__(
        self,
        epoch: int = 0,
        lease_s: float = 0.0,
        lease_anchor: float | None = None,
        rendezvous: Rendezvous | None = None,
        run_id: str = "",
    ) -> None:
        self._lock = threading.Lock()
        self.run_id = run_id
        """The job's one run across restarts and failovers (Start's ``run_id``; "" when none)."""
        self.rendezvous = rendezvous
        """A multi-host job's meeting point for this epoch (None: one host)."""
        self._checkpoint_reason: str | None = None
        self._stop: StopRequest | None = None
        self.epoch = epoch
        self.lease_ttl_s = lease_s
        self.lease_deadline: float | None = None
        if lease_s > 0:
            self.lease_deadline = _from(lease_anchor) + lease_s
        self._lease_watchers: list[Callable[[float | None], None]] = []
        self.abandoned = threading.Event()
        """The console said this epoch's group will not form (``Abandon``): a join still
        waiting for it gives up."""

    def watch_lease(self, watcher: Callable[[float | None], None]) -> Callable[[], None]:
        """Call ``watcher`` with the lease's end now and on every renewal (from the thread that
        renews; it must not block): how a run's fence learns the lease. Returns the undo."""
        with self._lock:
            self._lease_watchers.append(watcher)
            deadline = self.lease_deadline
        watcher(deadline)

        def unwatch() -> None:
            with self._lock:
                if watcher in self._lease_watchers:
                    self._lease_watchers.remove(watcher)

        return unwatch

    def request_checkpoint(self, reason: str) -> None:
        with self._lock:
            self._checkpoint_reason = reason

    def take_checkpoint_request(self) -> str | None:
        with self._lock:
            reason, self._checkpoint_reason = self._checkpoint_reason, None
            return reason

    def request_stop(
        self,
        reason: StopReason,
        *,
        checkpoint: bool,
        exit_code: int,
        fault: FaultKind | None = None,
    ) -> None:
        """The first stop request wins; a later one (say, a second signal) does not change it."""
        if self._stop is None:
            self._stop = StopRequest(reason, checkpoint, exit_code, fault)

    @property
    def stop(self) -> StopRequest | None:
        return self._stop

    def renew(self, epoch: int, ttl_s: float, anchor: float | None = None) -> bool:
        """Extend the lease to ``anchor + ttl_s`` (this executor's clock); refused for another
        epoch, when already stale, or once the lease has ended (a lapsed lease stays lapsed)."""
        with self._lock:
            if epoch != self.epoch:
                return False
            if self.lease_deadline is not None and self.lease_deadline <= clock.now():
                return False
            until = _from(anchor) + ttl_s
            if until <= clock.now():
                return False
            self.lease_ttl_s = ttl_s
            self.lease_deadline = deadline = max(self.lease_deadline or 0.0, until)
            watchers = list(self._lease_watchers)
        for watcher in watchers:
            watcher(deadline)
        return True

    def lease_left(self) -> float | None:
        deadline = self.lease_deadline
        return None if deadline is None else deadline - clock.now()

    def lease_valid(self, margin_s: float = 0.0) -> bool:
        """No lease (fencing off), or one with more than ``margin_s`` left."""
        left = self.lease_left()
        return left is None or left > margin_s


def _from(anchor: float | None) -> float:
    """Where a lease starts: its anchor, never later than now (a console cannot grant the future)."""
    t = clock.now()
    return t if anchor is None else min(anchor, t)
