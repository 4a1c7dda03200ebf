"""Lost steps are counted from steps actually completed: the report once said "lost steps: 0
(last step 189, resumed at 200)", and after a console restart "last step 200, resumed at 523"."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from support.manifests import manifest

from console.records.incidents import IncidentLog, incidents
from console.records.journal import Journal, read
from console.records.state_store import JobRecord, StateStore
from console.supervise.finish import last_step
from console.supervise.incident import OpenIncident
from console.supervise.live import LiveJob
from console.supervise.outcome import Exit, Outcome
from protocol.spec import JobSpec


def _log(tmp_path: Path) -> tuple[Journal, IncidentLog]:
    journal = Journal(tmp_path / "journal.jsonl")
    return journal, IncidentLog(journal, StateStore(tmp_path / "state.json"))


def test_a_checkpoint_newer_than_the_last_progress_counts_as_completed(tmp_path: Path) -> None:
    journal, log = _log(tmp_path)
    live = LiveJob(name="j", spec=JobSpec(name="j", steps=400), rec=JobRecord(), host="a")
    live.step = 189  # the last Progress the console saw
    live.checkpoint = manifest(200)
    incident = OpenIncident(live, log=log, preparing=lambda: False)
    incident.open("host_lost", "gone")
    incident.phase("loaded", step=200)
    journal.close()
    (inc,) = incidents(read(tmp_path / "journal.jsonl"))
    assert (inc.last_step, inc.resumed_step, inc.lost_steps) == (200, 200, 0)


def test_a_later_phase_that_knows_a_later_step_raises_the_last_step(tmp_path: Path) -> None:
    """A console restarted: it opened the incident at the step it last knew (200), then
    reattached to an executor that had trained on to 523 and lost nothing."""
    journal, log = _log(tmp_path)
    n = log.open("j", "a", "console_restart", fault_at=1.0, last_step=200, msg="restart")
    log.phase(n, "j", "loaded", step=523, last_step=523)
    log.phase(n, "j", "first_step", step=524)
    journal.close()
    (inc,) = incidents(read(tmp_path / "journal.jsonl"))
    assert (inc.last_step, inc.resumed_step, inc.lost_steps) == (523, 523, 0)


def test_an_incident_stopped_then_started_counts_from_its_earliest_resume(tmp_path: Path) -> None:
    """Stopped before it recovered, it is 'stopped' (no lost steps yet, not open); started
    again it goes on: a resume at 40, stopped, a resume at 40 again... the steps past the
    earliest resume were trained again, whatever resumes followed."""
    journal, log = _log(tmp_path)
    t0 = time.time()  # the incident opens now: its phases come after
    n = log.open("j", "a", "host_lost", fault_at=t0 - 1, last_step=57, msg="gone")
    log.phase(n, "j", "loaded", step=40, at=t0 + 2)
    log.phase(n, "j", "ended", state="stopped", why="operator", at=t0 + 3)
    journal.flush()
    (inc,) = incidents(read(tmp_path / "journal.jsonl"))
    assert (inc.resolution.value, inc.mttr_s, inc.ended_why) == ("stopped", None, "operator")
    log.phase(n, "j", "started", at=t0 + 9)
    log.phase(n, "j", "loaded", step=50, at=t0 + 11)
    log.phase(n, "j", "first_step", step=51, at=t0 + 12)
    journal.close()
    (inc,) = incidents(read(tmp_path / "journal.jsonl"))
    assert (inc.resolution.value, inc.resumed_step, inc.lost_steps) == ("recovered", 40, 17)
    assert inc.stopped_once and inc.mttr_s == pytest.approx(13)
    parts = inc.breakdown()
    assert parts["stopped"] == pytest.approx(6) and sum(parts.values()) == pytest.approx(13)


@pytest.mark.parametrize(
    ("progress", "checkpoint", "ends", "last"),
    [
        (189, None, [], 189),  # its last Progress
        (189, 200, [], 200),  # a checkpoint between Progress messages: step 200 was completed
        (189, 200, [(210, None)], 210),  # an executor's end said a later step
        (189, 200, [(None, 220)], 220),  # ... or a later checkpoint (a preemption's at the stop)
        (189, 200, [(195, None), (None, 230), (201, None)], 230),  # a group: the latest member
        (250, 200, [(210, 220)], 250),  # nothing said later than the last Progress
    ],
)
def test_the_last_step_is_the_latest_of_progress_checkpoint_and_what_the_ends_said(
    progress: int,
    checkpoint: int | None,
    ends: list[tuple[int | None, int | None]],
    last: int,
) -> None:
    """One count for both recoveries (a restart's forgiveness and a failover's decision)."""
    live = LiveJob(name="j", spec=JobSpec(name="j", steps=400), rec=JobRecord(), host="a")
    live.step = progress
    live.checkpoint = manifest(checkpoint) if checkpoint is not None else None
    outcomes = [Outcome(Exit.CRASHED, "x", step=s, checkpoint_step=c) for s, c in ends]
    assert last_step(live, outcomes) == last
