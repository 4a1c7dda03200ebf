"""Exit codes of ``hotspare-executor``; the console classifies an exit by these."""

OK = 0
"""The job ran to its last step."""
FAILED = 1
"""The workload failed and could not recover (an executor crash)."""
CONFIG = 2
"""Bad arguments or job spec; permanent, do not retry."""
BUSY = 3
"""Another executor already holds this workdir."""
PREEMPTED = 75
"""SIGTERM (a preemption notice): a checkpoint at the current step was written, then exit."""
STOPPED = 76
"""Told to stop or drain by the console; checkpointed first when asked."""
LEASE_LOST = 77
"""The lease was not renewed in time: checkpointed and stopped before it ended."""
DISK_FULL = 79
"""Checkpoints kept failing for lack of space, even after pruning."""
INTERRUPTED = 130
"""SIGINT (Ctrl-C): checkpointed at the current step, then exit."""
