"""One incident's report, as ``hotspare report`` writes it and the incident screen shows it:
the timeline in time order, one event a line, each phase named once.

The incident is recorded the way a failover records it: the target is readied (decided,
transfer_done) while the lease runs out, before the incident opens, so those phases reach the
journal after ``detected`` with their earlier times."""

from __future__ import annotations

import io
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from textual.app import App
from textual.widgets import Markdown
from textual.widgets._markdown import MarkdownFence, MarkdownParagraph

from console import clock
from console.records.incidents import Incident, IncidentLog, incidents
from console.records.journal import Journal, Kind, read
from console.records.report import EARLY, render, render_incident
from console.records.state_store import JobRecord, StateStore
from console.supervise.incident import OpenIncident
from console.supervise.live import LiveJob
from console.ui.screens.incidents import IncidentReportScreen
from protocol.spec import JobSpec

TIME = re.compile(r"^\d\d:\d\d:\d\d\.\d{3}  ")
HOSTILE = "disk *full* on `/data` [bold]x[/]"


@pytest.fixture
def wall(monkeypatch: pytest.MonkeyPatch) -> None:
    """A wall clock that moves one second at each reading, so every event has its own time."""
    ticks = iter(range(1_800_000_000, 1_900_000_000))
    monkeypatch.setattr(clock, "wall", lambda: float(next(ticks)))


def failover(tmp_path: Path) -> Incident:
    journal = Journal(tmp_path / "journal.jsonl")
    job = LiveJob(
        name="demo", spec=JobSpec(name="demo", steps=600), rec=JobRecord(host="a"), host="a"
    )
    incident = OpenIncident(
        job, log=IncidentLog(journal, StateStore(tmp_path)), preparing=lambda: True
    )
    incident.phase("decided", action="failover", host="b")  # readied while the lease runs out
    incident.phase("transfer_done", step=200)
    incident.open("lease_lost", f"no heartbeat: {HOSTILE}")
    incident.phase("executor_up")
    incident.phase("loaded", step=200, load_s=0.5)
    incident.phase("first_step", step=201)
    (found,) = incidents(read(journal.path, kinds=(Kind.INCIDENT,)))
    return found


def report(found: Incident) -> str:
    out = io.StringIO()
    render_incident(found, out)
    return out.getvalue()


def timeline(text: str) -> list[str]:
    """The report's timeline lines, however indented."""
    return [line.strip() for line in text.splitlines() if TIME.match(line.strip())]


def test_the_timeline_is_in_time_order_and_names_each_phase_once(
    tmp_path: Path, wall: None
) -> None:
    found = failover(tmp_path)
    recorded = [e.data["phase"] for e in found.lines]
    assert recorded[:3] == ["detected", "decided", "transfer_done"], "journal order differs"
    lines = timeline(report(found))
    assert [line.split()[1] for line in lines] == [
        "decided",
        "transfer_done",
        "detected",
        "executor_up",
        "loaded",
        "first_step",
    ]
    assert [line[:12] for line in lines] == sorted(line[:12] for line in lines)
    for line, phase in zip(lines, ("decided", "transfer_done", "detected"), strict=False):
        assert line.count(phase) == 1, line
        assert "incident 1" not in line, line
    assert lines[0].endswith(f"decided        action failover, host b; {EARLY}"), lines[0]
    assert [EARLY in line for line in lines] == [True, True, False, False, False, False]
    assert lines[4].endswith("step 200, load s 0.50 s"), lines[4]
    assert HOSTILE in lines[2], "the host's words as written"


class ReportApp(App[None]):
    """Just enough of the console for the incident screen: a controller with a timeline."""

    def __init__(self, found: Incident) -> None:
        super().__init__()
        self.ctl: Any = SimpleNamespace(timeline=SimpleNamespace(incident=lambda n: found))

    def on_mount(self) -> None:
        self.push_screen(IncidentReportScreen(1))


async def test_the_incident_screen_shows_one_event_a_line(tmp_path: Path, wall: None) -> None:
    found = failover(tmp_path)
    app = ReportApp(found)
    async with app.run_test(size=(160, 45)) as pilot:
        await pilot.pause()
        markdown = app.screen.query_one("#report", Markdown)
        fences = list(markdown.query(MarkdownFence))
        assert len(fences) == 1, "the timeline is a block of its own"
        drawn = fences[0].code.splitlines()
        assert drawn == timeline(report(found)) and len(drawn) == 6
        assert HOSTILE in drawn[2], "shown as written, not as markdown or markup"
        for paragraph in markdown.query(MarkdownParagraph):
            assert not TIME.search(str(paragraph.render())), "no timeline run into a paragraph"


def test_the_summary_counts_one_incident_in_the_singular(tmp_path: Path, wall: None) -> None:
    found = failover(tmp_path)
    out = io.StringIO()
    render([found], {}, out)
    assert "over 1 resolved incident.\n" in out.getvalue()
    out = io.StringIO()
    render([found, found], {}, out)
    assert "over 2 resolved incidents.\n" in out.getvalue()


def test_a_shrink_is_an_incident_of_class_shrunk_caused_by_the_loss(tmp_path: Path) -> None:
    """A host lost with no host to take its rank: the incident opens as host_lost; its decision
    (shrink the elastic group) gives it the class the report shows, the loss kept as cause."""
    journal = Journal(tmp_path / "journal.jsonl")
    job = LiveJob(
        name="demo", spec=JobSpec(name="demo", steps=600), rec=JobRecord(host="a"), host="c"
    )
    incident = OpenIncident(
        job, log=IncidentLog(journal, StateStore(tmp_path)), preparing=lambda: False
    )
    incident.open("host_lost", "c: unreachable past its lease")
    size = {"from": 3, "to": 2, "planned": 3}
    incident.phase("decided", action="shrink", host="c", size=size, **{"class": "shrunk"})
    incident.phase("loaded", step=40)
    incident.phase("first_step", step=41)
    journal.close()
    (inc,) = incidents(read(tmp_path / "journal.jsonl"))
    assert (inc.fault_class, inc.cause, inc.size) == ("shrunk", "host_lost", size)
    out = io.StringIO()
    render([inc], {}, out)
    text = out.getvalue()
    assert "| demo | c | shrunk |" in text
    assert "- caused by: host_lost\n" in text
    assert "- size: 3 -> 2 of 3 hosts\n" in text


def test_the_report_gives_an_elastic_job_s_throughput_at_each_size(tmp_path: Path) -> None:
    from console.records.report import write_report

    journal = Journal(tmp_path / "journal.jsonl")
    for rate, size in ((4.0, 3), (4.2, 3), (2.9, 2), (4.1, 3)):
        data = {"step": 1, "loss": 1.0, "steps_per_s": rate, "world_size": size}
        journal.record(Kind.PROGRESS, "big: step", job="big", data=data)
    journal.record(
        Kind.PROGRESS, "one: step", job="one", data={"steps_per_s": 9.0, "world_size": 1}
    )
    journal.close()
    out = io.StringIO()
    assert write_report(tmp_path, out) == 0
    text = out.getvalue()
    assert "| big | 3 | 4.10 | 3 |\n| big | 2 | 2.90 | 1 |\n" in text
    assert "| one |" not in text, "a job that trained at one size has no such table"


def test_a_grow_that_lost_its_newcomer_stays_a_grow(tmp_path: Path) -> None:
    """The host a group grew onto died before the grown epoch trained: the group shrank back
    under the same incident. It is the grow's incident still (planned, class grown), its last
    size change the one that stood, not a shrink caused by a grow."""
    journal = Journal(tmp_path / "journal.jsonl")
    job = LiveJob(
        name="demo", spec=JobSpec(name="demo", steps=600), rec=JobRecord(host="a"), host="a"
    )
    incident = OpenIncident(
        job, log=IncidentLog(journal, StateStore(tmp_path)), preparing=lambda: False
    )
    incident.open("grown", "d is free: growing 2 -> 3 of 3 hosts", planned=True)
    grow = {"from": 2, "to": 3, "planned": 3}
    incident.phase("decided", action="grow", host="d", size=grow, **{"class": "grown"})
    back = {"from": 3, "to": 2, "planned": 3}
    incident.phase("decided", action="shrink", host="d", size=back, **{"class": "shrunk"})
    journal.close()
    (inc,) = incidents(read(tmp_path / "journal.jsonl"))
    assert (inc.fault_class, inc.cause, inc.planned, inc.size) == ("grown", None, True, back)


def test_the_report_lists_each_provision_and_release_with_its_seconds(tmp_path: Path) -> None:
    from console.records.report import write_report

    journal = Journal(tmp_path / "journal.jsonl")
    journal.record(Kind.ACTION, "provisioner: start", data={"provision": "start", "attempt": 1})
    failed = {"provision": "failed", "seconds": 1.25, "error": "make-host exited 1: quota | x"}
    journal.record(Kind.ACTION, "provisioner: failed", data=failed)
    done = {"provision": "done", "host": "prov-1", "seconds": 41.0, "made_s": 38.5}
    done |= {"preflight_s": 1.5, "deploy_s": 0.75}
    journal.record(Kind.ACTION, "provisioner: prov-1 provisioned", host="prov-1", data=done)
    gone = {"release": "done", "host": "prov-1", "seconds": 3.5, "idle_s": 1800.0}
    journal.record(Kind.ACTION, "provisioner: prov-1 released", host="prov-1", data=gone)
    journal.close()
    out = io.StringIO()
    assert write_report(tmp_path, out) == 0
    text = out.getvalue()
    rows = [line for line in text.splitlines() if line.startswith("| ") and ":" in line[:12]]
    assert [r.split(" | ")[1:4] for r in rows] == [
        ["-", "provision failed", "1.2"],
        ["prov-1", "provision done", "41.0"],
        ["prov-1", "release done", "3.5"],
    ]
    assert "quota / x" in rows[0], "the cell keeps the error, its pipe made harmless"
    assert rows[1].endswith("| made 38.5 s, preflight 1.5 s, deploy 0.8 s |"), rows[1]
