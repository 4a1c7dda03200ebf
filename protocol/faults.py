"""Names of the faults an executor reports in ``Fault.fault``; the console classifies by them."""

from __future__ import annotations

from enum import StrEnum


class FaultKind(StrEnum):
    CHECKPOINT_CORRUPT = "checkpoint_corrupt"
    """A checkpoint failed its size/sha256 check or would not load; the previous one is used."""
    CHECKPOINT_MISMATCH = "checkpoint_mismatch"
    """A checkpoint of another spec or a newer epoch; not loaded."""
    CHECKPOINT_WRITE = "checkpoint_write"
    """Writing a checkpoint failed (I/O error); the previous one stays."""
    DISK_FULL = "disk_full"
    """ENOSPC while writing a checkpoint; old checkpoints were pruned."""
    OOM = "oom"
    """Out of memory in a step; the micro-batch was halved, the global batch kept."""
    NAN = "nan"
    """NaN/Inf loss or gradients; rolled back to the last good checkpoint, batch skipped."""
    PREEMPTED = "preempted"
    """SIGTERM: checkpoint at the current step, then exit."""
    LEASE_LOST = "lease_lost"
    """The lease ran out before a renewal; checkpointed and stopped."""
    RESUME_FAILED = "resume_failed"
    """A member could not load the committed step the console told it to resume from
    (``step``): the run ends (``RunEnded`` with this fault, the executor waiting), and the
    console restarts it from an older step, spending no restart in place on it."""
    CRASH = "crash"
    """The workload raised (or a wrapped command exited non-zero); the executor exits non-zero."""
    HANG = "hang"
    """A wrapped command made no progress for its ``hang_timeout_s``; it was killed and the
    executor exits non-zero, to be restarted in place."""
    WORKDIR_BUSY = "workdir_busy"
    """A warm twin told Start while the job's executor still holds the workdir: refused, the
    twin exits (never two trainers of one job)."""
    CONFIG = "config"
    """The job's spec or command cannot run here (a bad config key, a missing file): not
    restarted, the job fails with the message."""
    PROTOCOL = "protocol"
    """A peer sent something that is not a valid frame or message."""


RESTARTABLE = frozenset({FaultKind.CRASH, FaultKind.HANG, FaultKind.RESUME_FAILED})
"""How a run may end and leave its executor waiting for a restart in place (``RunEnded``)."""


class StopReason(StrEnum):
    """Why an executor stops: what a ``Stop`` or ``Drain`` asks and what its ``Stopped`` says
    (the console classifies the ending by it: ``console.supervise.outcome``)."""

    OPERATOR = "operator"
    """An operator's stop (``s``, ``hotspare stop``)."""
    NOT_NEEDED = "not_needed"
    """An idle executor the console has no use for (a twin, a standby, one it did not adopt)."""
    DRAIN = "drain"
    """An operator drained the host: checkpoint, stop, move."""
    MIGRATE = "migrate"
    """A planned move: an operator's failover, or a GPU that warns sample after sample."""
    GPU_FAIL = "gpu_fail"
    """The host's GPU fails a health rule: the host is drained and the job moves."""
    GROWN = "grown"
    """An elastic group stops at a step to start again one host larger."""
    PREEMPTED = "preempted"
    """SIGTERM to the executor: its host is going away."""
    INTERRUPTED = "interrupted"
    """SIGINT to the executor (a foreground run's Ctrl-C)."""
    LEASE_LOST = "lease_lost"
    """Its lease ended before a renewal came."""
    STALE_EPOCH = "stale_epoch"
    """A newer epoch of the job was granted: this one stops without a checkpoint."""
    WORKDIR_BUSY = "workdir_busy"
    """A warm twin was told to Start while the job's executor still held the workdir."""
    DISK_FULL = "disk_full"
    """Checkpoints keep failing on a full disk."""
    NO_CONSOLE = "no_console"
    """An idle executor no console linked to within its wait."""
    PEER_STOPPED = "peer_stopped"
    """A group's member stops at the step its group agreed on: another member's stop."""


PLANNED_STOPS = frozenset(
    {
        StopReason.PREEMPTED,
        StopReason.DRAIN,
        StopReason.MIGRATE,
        StopReason.GPU_FAIL,
        StopReason.INTERRUPTED,
        StopReason.GROWN,
    }
)
"""Stops that end a run on purpose with a checkpoint at the step: the job moves or restarts
with no step lost."""
