"""Restart in place, one decision for a single host's job and a group's members alike: may the
run start again on the host it ended on, and is there a restart left in the budget
(``restart_limit`` in a row; a checkpoint past the step a restart resumed from pays them off:
``JobSaid.committed``), and what follows when it
is spent: the job moves off that host once; spent again on the next host before any checkpoint
past the restart (a crash in the job's code or data, not in a host), the job fails as a crash
loop instead of moving back and forth between hosts for ever.

Found in the merge of the two recoveries (issue 30): each had its own copy of both. A single
host's job restarted on a host failing a health rule that was not (yet) drained; a group's
member did not.
"""

from __future__ import annotations

from collections.abc import Callable

from console.fleet.hosts import Fleet
from console.records.state_store import JobRecord
from console.states import HostState, JobState
from console.supervise.incident import OpenIncident
from console.supervise.live import LiveJob, Transitions

MAY_RESTART = (HostState.UP, HostState.SUSPECT, HostState.CORDONED)
"""Host states a run may start again on: a cordon is no new work, a job there keeps its host."""


def not_again_on(fleet: Fleet, host: str, leave: dict[str, str]) -> str | None:
    """Why the job's run may not start again on ``host`` (None: it may): being released (its
    release command takes it away), failing a health rule, to be left (a GPU that warned sample
    after sample, an operator's move: ``LiveJob.leave``), or down, draining or drained."""
    rt = fleet.hosts[host]
    if rt.leaving:
        return "it is being released"
    failing = fleet.failing(host)
    if failing:
        return f"it fails a health rule ({failing[0].message})"
    if host in leave:
        return leave[host]
    if rt.state not in MAY_RESTART:
        return f"it is {rt.state.value}"
    return None


class RestartBudget:
    """The job's restarts in place, counted in its persisted record."""

    def __init__(
        self,
        live: LiveJob,
        *,
        states: Transitions,
        incident: OpenIncident,
        save: Callable[[], object],
        limit: int,
    ) -> None:
        self._live = live
        self._states = states
        self._incident = incident
        self._save = save
        self.limit = limit

    def take(self, host: str, why: str, last_step: int) -> bool:
        """One more restart in place on ``host``, if any is left: counted and persisted, the
        job restarting, the incident's decision recorded. False: the limit is reached (the
        caller moves the job off the host)."""
        job = self._live
        if job.rec.restarts >= self.limit:
            return False
        job.rec.restarts += 1
        self._save()
        self._states.move(
            JobState.RESTARTING, f"{why}; restart {job.rec.restarts} of {self.limit} on {host}"
        )
        self._incident.phase("decided", action="restart", host=host, last_step=last_step)
        return True

    def retry(self, host: str, why: str, last_step: int) -> None:
        """A restart in place that takes none of the budget: a member could not load the step
        chosen, and the next epoch resumes from an older one (not the same crash again)."""
        self._states.move(
            JobState.RESTARTING, f"{why}; restarting from an older step (no restart spent)"
        )
        self._incident.phase("decided", action="restart", host=host, last_step=last_step)

    def refused(self, host: str, why: str) -> str | None:
        """``take`` said no: the job says the limit is reached, and the budget is counted spent
        on ``host`` (``spent_on``'s answer)."""
        self._states.move(JobState.RESTARTING, "restart limit reached")
        return self.spent_on(host, why)

    def spent_on(self, host: str, why: str) -> str | None:
        """The budget ran out on ``host``: counted (persisted) among the hosts the run crash-
        looped on. None: the job moves off it. Else why the job fails: the loop followed it to
        a second host."""
        rec = self._live.rec
        if host not in rec.crash_looped:
            rec.crash_looped.append(host)
            self._save()
        if len(rec.crash_looped) < 2:
            return None
        return (
            f"the run crash-looped on {' and then '.join(rec.crash_looped)} ({self.limit} "
            f"restarts on each, the last: {why}): the fault follows the job, not a host; "
            "start it again once fixed"
        )


def owed(rec: JobRecord) -> bool:
    """Whether a checkpoint past the restart point has anything to pay off (``paid_off``)."""
    return bool(rec.restarts or rec.crash_looped)


def paid_off(rec: JobRecord) -> None:
    """A checkpoint past the step a restart resumed from: the run got over its crash, so the
    restarts count from zero and no host is held against it."""
    rec.restarts = 0
    rec.crash_looped = []
