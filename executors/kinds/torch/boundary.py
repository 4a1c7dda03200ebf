"""The step boundary: between two steps, whether to stop and whether to checkpoint.

A host stops for a stop request, for its lease (with room to checkpoint before it ends, or
at once and without writing once it has ended), or after repeated checkpoint write failures.
The ranks of a multi-host job must checkpoint the same steps and stop at the same step, or
the others wait in the next collective: there one rank's wish (save, stop) is agreed on by
all (``Group.agree``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol

from executors import exitcodes
from executors.agent.control import Control
from executors.fencing.guard import PUBLISH_MARGIN_S, LeaseGuard, Verdict
from executors.kinds.torch.dist import Group
from protocol.faults import FaultKind, StopReason
from protocol.messages import Fault

MAX_CHECKPOINT_FAILURES = 3


@dataclass(frozen=True)
class Halt:
    """Why the step loop stops at a boundary, and the fault to report when it does."""

    reason: StopReason
    exit_code: int
    checkpoint: bool
    fault: Fault | None = None


class Writes(Protocol):
    """What a boundary reads of the checkpoint writer (``CheckpointManager``)."""

    consecutive_failures: int
    last_write_s: float


class Boundary:
    """The decisions between steps; the step loop saves (``save``) and stops (a ``Halt``).

    ``save(reason)`` checkpoints the current step unless it is saved already; ``step_time()``
    is the recent time per step, which sizes the lease guard.
    """

    def __init__(
        self,
        control: Control,
        ckpt: Writes,
        *,
        save: Callable[[str], None],
        step_time: Callable[[], float],
    ) -> None:
        self.control = control
        self.lease = LeaseGuard(control)
        self.ckpt = ckpt
        self._save = save
        self._step_time = step_time
        self.save_due: str | None = None
        """A multi-host periodic checkpoint waits for the boundary, where the ranks agree on it."""

    def decide(self, step: int, group: Group | None) -> Halt | None:
        """Honour a stop, the lease, a checkpoint request, repeated write failures."""
        if group is not None:
            return self._agreed(step, group)
        halt = self.halt_wanted(step)
        if halt is not None:
            return halt
        reason = self.control.take_checkpoint_request()
        if reason is not None:
            self._save(reason)
        if self.ckpt.consecutive_failures >= MAX_CHECKPOINT_FAILURES:
            return Halt(StopReason.DISK_FULL, exitcodes.DISK_FULL, checkpoint=False)
        return None

    def _agreed(self, step: int, group: Group) -> Halt | None:
        """Every rank must checkpoint the same steps and stop at the same step, or the others
        wait in the next collective: one rank's wish (save, stop) is agreed on by all."""
        halt = self.halt_wanted(step)
        if halt is None and self.ckpt.consecutive_failures >= MAX_CHECKPOINT_FAILURES:
            halt = Halt(StopReason.DISK_FULL, exitcodes.DISK_FULL, checkpoint=False)
        reason, self.save_due = self.control.take_checkpoint_request() or self.save_due, None
        agreed = group.agree(
            save=reason is not None,
            stop=halt is not None,
            checkpoint=halt is not None and halt.checkpoint,
        )
        if agreed.stop:
            halt = halt or Halt(StopReason.PEER_STOPPED, exitcodes.STOPPED, checkpoint=True)
            # a rank whose lease has ended writes nothing (publishing would refuse it anyway)
            keep = agreed.checkpoint and self.lease.valid()
            return replace(halt, checkpoint=keep)
        if agreed.save:
            self._save(reason or "agreed")
        return None

    def halt_wanted(self, step: int) -> Halt | None:
        """Why this host would stop at this boundary: a stop request, or its lease."""
        stop = self.control.stop
        if stop is not None:
            text = f"{stop.reason}: checkpointing at step {step} and stopping"
            fault = Fault(fault=stop.fault, step=step, message=text) if stop.fault else None
            return Halt(stop.reason, stop.exit_code, stop.checkpoint, fault)
        verdict = self.lease.verdict(self._stop_needs())
        if verdict is Verdict.ENDED:
            return self.lease_ended(step)
        if verdict is Verdict.ENDING:
            text = (
                f"lease of epoch {self.control.epoch} ends in {max(self.lease.left() or 0, 0):.1f}s "
                "without renewal; checkpointing and stopping"
            )
            fault = Fault(fault=FaultKind.LEASE_LOST, step=step, message=text)
            return Halt(StopReason.LEASE_LOST, exitcodes.LEASE_LOST, True, fault)
        return None

    def lease_ended(self, step: int) -> Halt:
        text = f"lease of epoch {self.control.epoch} has ended; stopping without writing"
        fault = Fault(fault=FaultKind.LEASE_LOST, step=step, message=text)
        return Halt(StopReason.LEASE_LOST, exitcodes.LEASE_LOST, False, fault)

    def _stop_needs(self) -> float:
        """The room to stop cleanly: two steps and one checkpoint write, published with more
        than the publish margin left."""
        return 2 * self._step_time() + 1.5 * self.ckpt.last_write_s + 0.2 + PUBLISH_MARGIN_S
