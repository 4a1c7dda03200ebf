"""How an executor's run ended, as the console classifies it (the fault classes of docs/guarantees.md)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from enum import StrEnum

import msgspec

from protocol.faults import PLANNED_STOPS, FaultKind, StopReason
from protocol.messages import CheckpointSaved, ExecutorMessage, Fault, Finished, RunEnded, Stopped


class Exit(StrEnum):
    FINISHED = "finished"
    CRASHED = "executor_crash"
    """The executor died (non-zero exit, SIGKILL, exception): restart in place."""
    RUN_CRASHED = "run_crash"
    """The training died (the command exited or was killed, the torch run raised) and its
    executor stayed, told so in a ``RunEnded``: restart in place, by a Start to that executor."""
    RESUME_FAILED = "resume_failed"
    """The run could not load the committed step it was told to resume from, and its executor
    stayed (``RunEnded``): restarted in place from an older step, no restart spent on it."""
    HUNG = "executor_hang"
    """Alive but silent past its lease: killed, then restarted in place."""
    HOST_LOST = "host_lost"
    """Unreachable past the end of its lease: fail over."""
    PLANNED = "planned"
    """Checkpointed at the current step and stopped (drain, preemption, GPU FAIL): move, 0 lost steps."""
    LEASE_LOST = "lease_lost"
    """The executor stopped itself because its lease was not renewed."""
    CONFIG = "config"
    """Will not get better by retrying: fail fast."""
    STOPPED = "stopped"
    """An operator stopped the job."""


CRASHES = frozenset({Exit.CRASHED, Exit.RUN_CRASHED})
"""The run died of itself, executor and all or only the training."""
WAITING = frozenset({*CRASHES, Exit.RESUME_FAILED})
"""Ends after which the member's executor may still wait for a Start (asked to stay warm)."""
RESTART_IN_PLACE = frozenset({*WAITING, Exit.HUNG, Exit.LEASE_LOST})
"""Ends a restart on the same host answers (while the host may take one)."""


@dataclass(frozen=True)
class Outcome:
    exit: Exit
    why: str
    step: int | None = None
    sha256: str | None = None
    checkpoint_step: int | None = None
    warnings: tuple[str, ...] = ()
    """A finish that is not clean says why (``Finished.warnings``)."""
    reason: str = ""
    """An executor that stopped: the reason it gave (``Stopped.reason``), whether it was told
    over the link or read back from its events.jsonl."""
    saved: CheckpointSaved | None = None
    """The run's last checkpoint, read back from its events.jsonl: the link may have closed
    before its CheckpointSaved was read (a preemption's checkpoint at the stop, say), and a
    failover that did not know of it resumed from an older one and lost steps."""

    @property
    def preempted(self) -> bool:
        """Stopped because its host is going away (SIGTERM): a move that must not come back."""
        return self.exit is Exit.PLANNED and self.reason == StopReason.PREEMPTED

    @property
    def peer_stopped(self) -> bool:
        """A group's member that stopped at the step its group agreed on because another
        member stopped: a consequence, never why the run ended."""
        return self.reason == StopReason.PEER_STOPPED

    def said(self) -> str:
        """The exit class and why, each word once: ``finished``, ``stopped: operator``,
        ``stopped: lease_lost``, ``run_crash: the command exited with code 1 after step 5``."""
        if not self.why:
            return self.exit.value
        return self.why if self.exit.value in self.why.split(": ") else f"{self.exit}: {self.why}"


def from_finished(step: int, sha256: str, warnings: list[str]) -> Outcome:
    return Outcome(Exit.FINISHED, "finished", step, sha256=sha256, warnings=tuple(warnings))


def from_stopped(reason: str, step: int, checkpoint_step: int | None) -> Outcome:
    exit, why = _stop_class(reason)
    return Outcome(exit, why, step, checkpoint_step=checkpoint_step, reason=reason)


def _stop_class(reason: str) -> tuple[Exit, str]:
    """A Stopped reason's exit class and what it says (a reason this console does not know,
    read back from an older executor's events, is a plain stop)."""
    try:
        known = StopReason(reason)
    except ValueError:
        return Exit.STOPPED, f"stopped: {reason}"
    if known in PLANNED_STOPS:
        return Exit.PLANNED, f"stopped for {known}"
    if known in (StopReason.LEASE_LOST, StopReason.STALE_EPOCH):
        return Exit.LEASE_LOST, f"stopped: {known}"
    if known is StopReason.WORKDIR_BUSY:  # a warm twin refused a Start: the job's executor ran
        return (
            Exit.CRASHED,
            "the warm twin refused the restart: the job's executor still held the workdir",
        )
    if known is StopReason.DISK_FULL:
        return Exit.CRASHED, "checkpoints keep failing: disk full"
    return Exit.STOPPED, f"stopped: {known}"


def from_run_ended(fault: str, message: str, step: int | None) -> Outcome:
    """A training run that died under its executor (``RunEnded``): a hang, or the run crashed
    (its message says how: the command's exit status or signal and its last stderr lines)."""
    if fault == FaultKind.HANG.value:
        return Outcome(Exit.HUNG, f"{fault}: {message}" if message else fault, step)
    if fault == FaultKind.CRASH.value:
        return Outcome(Exit.RUN_CRASHED, message or "the run crashed", step)
    if fault == FaultKind.RESUME_FAILED.value:
        return Outcome(Exit.RESUME_FAILED, f"{fault}: {message}" if message else fault, step)
    return Outcome(Exit.RUN_CRASHED, f"{fault}: {message}" if message else fault, step)


def run_end(msg: ExecutorMessage) -> Outcome | None:
    """How the run ended, if ``msg`` says it did (None: it trains on): a finish, a stop, a run
    that died under a live executor (``RunEnded``: the executor waits), or a configuration
    fault. One reading for a single host's executor and a group's member."""
    if isinstance(msg, Finished):
        return from_finished(msg.step, msg.params_sha256, msg.warnings)
    if isinstance(msg, Stopped):
        return from_stopped(msg.reason, msg.step, msg.checkpoint_step)
    if isinstance(msg, RunEnded):
        return from_run_ended(msg.fault, msg.message, msg.step)
    if isinstance(msg, Fault) and msg.fault == FaultKind.CONFIG:
        return Outcome(Exit.CONFIG, msg.message)
    return None


def from_events_tail(text: str) -> Outcome:
    """Classify an executor that is gone from the end of its events.jsonl; with the run's last
    checkpoint in that tail (``Outcome.saved``)."""
    lines = text.splitlines()
    outcome = _ending(lines)
    saved = _last_saved(lines)
    return outcome if saved is None else dataclasses.replace(outcome, saved=saved)


def _last_saved(lines: list[str]) -> CheckpointSaved | None:
    for line in reversed(lines):
        if '"checkpoint"' not in line:
            continue
        try:
            return msgspec.json.decode(line, type=CheckpointSaved)
        except msgspec.DecodeError:  # a torn or foreign line: an older one may still do
            continue
    return None


def _ending(lines: list[str]) -> Outcome:
    for line in reversed(lines):
        try:
            e = json.loads(line)
        except ValueError:
            continue
        kind = e.get("kind")
        if kind == "finished":
            return from_finished(e["step"], e["params_sha256"], e.get("warnings") or [])
        if kind == "stopped":
            return from_stopped(e.get("reason", ""), e.get("step", 0), e.get("checkpoint_step"))
        if kind == "fault" and e.get("fault") == "config":
            return Outcome(Exit.CONFIG, e.get("message", "configuration error"))
        if kind == "run_ended":  # the run died; its executor then ended too, unrestarted
            return from_run_ended(e.get("fault", ""), e.get("message", ""), e.get("step"))
        if kind == "fault" and e.get("fatal") and e.get("fault") == FaultKind.LEASE_LOST.value:
            # the watchdog's backstop: the lease ended mid-step, and the process ended at once
            return Outcome(Exit.LEASE_LOST, f"lease lost: {e.get('message', '')}", e.get("step"))
        if kind == "fault" and e.get("fault") == FaultKind.CRASH.value:
            return Outcome(Exit.CRASHED, f"crashed: {e.get('message', '')}")
        if kind in ("progress", "checkpoint", "resumed"):
            break
    return Outcome(Exit.CRASHED, "the executor died without a word (killed?)")
