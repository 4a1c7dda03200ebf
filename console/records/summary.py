"""Each job's summary for ``hotspare report``: goodput, steps lost to each incident class and
checkpoint overhead, from the journal alone.

The job's **wall time** runs from each start (its first state move after being new, failed
or finished) to its end (finished or failed), or to the journal's last event while it runs;
time it spent stopped or failed before being started again is not in it. Its **training
time** is the part of that from the first step the console was told of (the first Progress
after a start, or an incident's ``first_step``) to the fault that ended it (an incident's
``fault_at``, the last sign of life before the failure was detected) or to the end; while an
incident is open, nothing counts as training. **Goodput** is training time / wall time.
Steps trained again after a resume are in both times: ``lost steps`` counts them instead.

An example, in the journal's order::

    t=0  pending -> deploying       wall time starts
    t=2  progress step 1            training starts
    t=50 incident 1 detected        fault_at t=47: training stops at 47
    t=60 incident 1 first_step      training starts again
    t=100 finished                  wall time ends: wall 100, training 45 + 40, goodput 0.85

**Checkpoint overhead**: the seconds training stood still for checkpoints (each checkpoint's
``stall_s``; for a group, the longest of its members' at each step), in all and as a fraction
of training time.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from console.records.incidents import incidents
from console.records.journal import Event, Kind

SUMMARY_KINDS = (Kind.JOB_STATE, Kind.PROGRESS, Kind.INCIDENT, Kind.CHECKPOINT, Kind.FINISHED)
"""The journal events a summary is made from."""
ENDS = ("finished", "failed", "stopped")
"""Job states that end a life of the job (``hotspare`` may start a failed or stopped one again)."""


@dataclass
class LostSteps:
    incidents: int = 0
    steps: int = 0
    """Steps trained again after these incidents (those whose resume step is known)."""
    unresumed: int = 0
    """Of these incidents, those whose job has not resumed since (stopped, failed, open):
    their lost steps are not known yet, and not in ``steps``."""


@dataclass
class JobSummary:
    job: str
    wall_s: float
    training_s: float
    checkpoints: int
    stall_s: float
    lost: dict[str, LostSteps] = field(default_factory=dict)
    """Incident class -> how many, and the steps they lost."""

    @property
    def goodput(self) -> float | None:
        return self.training_s / self.wall_s if self.wall_s > 0 else None

    @property
    def stall_share(self) -> float | None:
        """Checkpoint stall as a fraction of training time."""
        return self.stall_s / self.training_s if self.training_s > 0 else None

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["goodput"], out["stall_share"] = self.goodput, self.stall_share
        return out


class _Life:
    """One job's walk through the journal: the time it lived and the time it trained."""

    def __init__(self) -> None:
        self.wall = self.training = 0.0
        self.alive_since: float | None = None
        self.training_since: float | None = None
        self.open: set[int] = set()
        """Incidents detected and not yet at their first step."""

    def start(self, t: float) -> None:
        if self.alive_since is None:
            self.alive_since = t

    def trains(self, t: float) -> None:
        if self.alive_since is not None and self.training_since is None and not self.open:
            self.training_since = t

    def fault(self, n: int, at: float) -> None:
        self.open.add(n)
        self.stop_training(at)

    def resumed(self, n: int, t: float) -> None:
        self.open.discard(n)
        self.trains(t)

    def stop_training(self, at: float) -> None:
        if self.training_since is not None:
            self.training += max(0.0, at - self.training_since)
            self.training_since = None

    def end(self, t: float) -> None:
        self.stop_training(t)
        if self.alive_since is not None:
            self.wall += max(0.0, t - self.alive_since)
        self.alive_since, self.open = None, set()


def summarise(events: Iterable[Event]) -> list[JobSummary]:
    """Each job that was started in these events, by name."""
    events = list(events)
    lives: dict[str, _Life] = {}
    stalls: dict[str, dict[tuple[int, int], float]] = {}
    last_t = 0.0
    for e in events:
        last_t = max(last_t, e.t)
        if e.job is None:
            continue
        if e.kind is Kind.JOB_STATE:
            begun = lives.setdefault(e.job, _Life())
            if e.data.get("to") in ENDS:
                begun.end(e.t)
            else:
                begun.start(e.t)
        elif (life := lives.get(e.job)) is None:
            continue
        elif e.kind is Kind.PROGRESS:
            life.trains(e.t)
        elif e.kind is Kind.INCIDENT and e.incident is not None:
            phase = e.data.get("phase")
            if phase == "detected":
                life.fault(e.incident, float(e.data.get("fault_at", e.t)))
            elif phase == "first_step":
                life.resumed(e.incident, e.t)
        elif e.kind is Kind.FINISHED:
            life.end(e.t)
        elif e.kind is Kind.CHECKPOINT and isinstance(e.data.get("stall_s"), int | float):
            at = (int(e.data.get("epoch") or 0), int(e.data.get("step") or 0))
            per_step = stalls.setdefault(e.job, {})
            per_step[at] = max(per_step.get(at, 0.0), float(e.data["stall_s"]))
    out = {}
    for job, life in lives.items():
        life.end(last_t)
        out[job] = JobSummary(
            job,
            wall_s=life.wall,
            training_s=life.training,
            checkpoints=len(stalls.get(job, {})),
            stall_s=sum(stalls.get(job, {}).values()),
        )
    for inc in incidents(events):
        if inc.job in out:
            lost = out[inc.job].lost.setdefault(inc.fault_class, LostSteps())
            lost.incidents += 1
            if inc.lost_steps is None:
                lost.unresumed += 1
            else:
                lost.steps += inc.lost_steps
    return [out[job] for job in sorted(out)]
