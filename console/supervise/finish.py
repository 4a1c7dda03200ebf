"""A job's end, told once for single-host jobs and groups: a finish recorded, journalled, and
when it is not clean (no checkpoint was ever taken, no params digest) alerted with why; and
the hosts an ended job held freed."""

from __future__ import annotations

from collections.abc import Callable

from console.fleet.hosts import Fleet
from console.records.journal import Journal, Kind
from console.states import JobState
from console.supervise.live import Alert, LiveJob, Transitions
from console.supervise.outcome import Outcome


def last_step(job: LiveJob, ends: list[Outcome]) -> int:
    """The last step a run completed (an incident's ``last_step``, what a restart counts
    from): its last Progress, its newest checkpoint (a fast job checkpoints between Progress
    messages), or what the ends of its executors said, whichever is latest."""
    saved = job.checkpoint.step if job.checkpoint is not None else 0
    said = [max(o.step or 0, o.checkpoint_step or 0) for o in ends]
    return max([job.step, saved, *said])


def finish(
    job: LiveJob,
    *,
    step: int,
    sha256: str,
    warnings: list[str],
    host: str | None,
    members: list[str] | None,
    states: Transitions,
    journal: Journal,
    alert: Alert,
    save: Callable[[], object],
) -> None:
    """``members``: a group's hosts (None for a single-host job)."""
    job.sha256, job.step = sha256, step
    job.rec.finished_sha256, job.rec.finished_step = sha256, step
    job.rec.finished_warnings = list(dict.fromkeys(warnings))
    save()
    states.move(JobState.FINISHED, f"step {step}")
    on = f" on {len(members)} hosts" if members is not None else ""
    data: dict[str, object] = {"step": step, "params_sha256": sha256}
    if members is not None:
        data["members"] = members
    if job.rec.finished_warnings:
        data["warnings"] = job.rec.finished_warnings
    journal.record(
        Kind.FINISHED,
        f"{job.name}: finished at step {step}{on}, params sha256 {sha256 or '(none)'}"
        + (", not clean" if job.rec.finished_warnings else ""),
        job=job.name,
        host=host,
        data=data,
    )
    for text in job.rec.finished_warnings:
        alert(f"{job.name} finished, not clean: {text}", job=job.name, host=host)


def release(job: LiveJob, fleet: Fleet) -> None:
    """The job is over (finished, failed, stopped): every host it held is free again (its host
    or members, and a target readied for it), and it keeps no spares."""
    for name in fleet.hosts:
        fleet.free(name, job.name, f"{job.name} is over")
    job.spares = []
    fleet.changed.set()
