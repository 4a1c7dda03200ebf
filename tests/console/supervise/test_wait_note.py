"""A job that waits for a host says so once: its note is what it waits for, and its alert is
not repeated at every wake while the wait lasts (``Transitions.wait_note``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from console.records.journal import Journal
from console.records.state_store import JobRecord
from console.states import JobState
from console.supervise.live import LiveJob, Transitions
from protocol.spec import JobSpec


@pytest.mark.parametrize("state", [JobState.PENDING, JobState.RUNNING], ids=["start", "recovery"])
def test_a_wait_is_the_jobs_note_and_one_alert_however_often_it_wakes(
    tmp_path: Path, state: JobState
) -> None:
    """At a start (pending already) the note stayed empty, and every wake alerted again, as
    the note never matched the wait's text; in a recovery (running) it was right."""
    live = LiveJob(name="j", spec=JobSpec(name="j", steps=10), rec=JobRecord())
    if state is JobState.RUNNING:
        live.machine.move(JobState.DEPLOYING)
        live.machine.move(JobState.RUNNING)
    alerts: list[str] = []

    def alert(msg: str, *, job: str | None = None, host: str | None = None) -> None:
        alerts.append(msg)

    states = Transitions(
        live,
        journal=Journal(tmp_path / "journal.jsonl"),
        alert=alert,
        alerted=lambda text: text in alerts,  # the controller's: sent lately
    )
    for _ in range(3):  # three wakes of one wait
        states.wait_note("no usable host for j")
    assert (live.state, live.why) == (JobState.PENDING, "no usable host for j")
    assert alerts == ["no usable host for j"]
