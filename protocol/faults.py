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
    """A member of a multi-host job could not load the step its group resumes from (``step``):
    the run ends, and the console chooses an older step for the next epoch."""
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
