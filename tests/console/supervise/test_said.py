"""``JobSaid``, what an executor says that updates its job, called directly with no process:
an incident ends only once training got past the step it resumed from (or at the run's last
step), and each world size's pace is kept for the estimates of an elastic job."""

from __future__ import annotations

from pathlib import Path

import pytest

from console.records.incidents import IncidentLog, incidents
from console.records.journal import Journal, read
from console.records.state_store import JobRecord, StateStore
from console.supervise.incident import OpenIncident
from console.supervise.live import LiveJob
from console.supervise.said import JobSaid
from protocol.messages import Progress, Resumed
from protocol.spec import JobSpec

STEPS = 400


def said(tmp_path: Path) -> tuple[JobSaid, LiveJob, Journal, list[Progress]]:
    journal = Journal(tmp_path / "journal.jsonl")
    log = IncidentLog(journal, StateStore(tmp_path / "state.json"))
    live = LiveJob(name="j", spec=JobSpec(name="j", steps=STEPS), rec=JobRecord(), host="a")
    told: list[Progress] = []
    incident = OpenIncident(live, log=log, preparing=lambda: False)
    return (
        JobSaid(live, journal=journal, incident=incident, progress=told.append, save=lambda: None),
        live,
        journal,
        told,
    )


def progress(step: int, world_size: int = 1, steps_per_s: float = 10.0) -> Progress:
    return Progress(
        step=step, steps=STEPS, loss=1.0, steps_per_s=steps_per_s, world_size=world_size
    )


@pytest.mark.parametrize(
    ("steps", "ends_at"),
    [
        ([200, 200, 201], 201),  # the resumed step said again is no step trained past it
        ([150, 201], 201),  # an older progress still on its way is not either
        ([STEPS], STEPS),  # the run's last step ends it (nothing comes past it)
    ],
)
def test_an_incident_ends_at_the_first_step_trained_past_the_resumed_one(
    tmp_path: Path, steps: list[int], ends_at: int
) -> None:
    s, live, journal, told = said(tmp_path)
    live.step = 230
    s._incident.open("executor_crash", "boom")
    s.resumed(Resumed(step=200, epoch=1, load_s=0.1, checkpoint="step-200.pt"))
    for step in steps:
        assert live.incident is not None, f"still open before step {step}"
        s.progressed(progress(step))
    assert live.incident is None
    journal.close()
    (inc,) = incidents(read(tmp_path / "journal.jsonl"))
    assert (inc.resumed_step, inc.resolution.value) == (200, "recovered")
    assert inc.lost_steps == 30
    assert [m.step for m in told] == steps, "the console is told of every Progress"
    assert live.step == ends_at


def test_each_world_size_keeps_its_own_pace(tmp_path: Path) -> None:
    """A shrunk elastic group trains slower: its estimate to grow back uses each size's pace."""
    s, live, _, _ = said(tmp_path)
    s.progressed(progress(10, world_size=3, steps_per_s=30.0))
    s.progressed(progress(11, world_size=2, steps_per_s=20.0))
    s.progressed(progress(12, world_size=2, steps_per_s=21.0))
    assert {size: pace for size, (pace, _) in live.rates.items()} == {3: 30.0, 2: 21.0}
    s.progressed(progress(13, world_size=2, steps_per_s=0.0))  # no pace yet: keeps the last
    assert live.rates[2][0] == 21.0
