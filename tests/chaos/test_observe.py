"""The harness's reading of the journal: where a job is placed, as the schedule aims faults."""

from __future__ import annotations

from chaos.observe import job_view
from console.records.journal import Event, Kind


def test_a_spare_taken_for_a_job_is_not_where_the_job_is_placed() -> None:
    """Chaos seed 87 of the 200-fault run at e0efa7a: j ran on b, the spare keeper then took
    a as its spare, and a fault aimed at 'the host j is being started on' hit a, its spare,
    and was then expected to open a host_lost incident for j."""
    events = [
        Event(t=1.0, kind=Kind.PLACEMENT, host="b", job="j", data={"spares": []}),
        Event(
            t=2.0,
            kind=Kind.JOB_STATE,
            host="b",
            job="j",
            data={"from": "deploying", "to": "running", "epoch": 2},
        ),
        Event(
            t=3.0,
            kind=Kind.PLACEMENT,
            host="a",
            job="j",
            msg="j: had no spare: a taken as its spare",
            data={"spares": ["a"], "change": "spare"},
        ),
    ]
    v = job_view(events, "j")
    assert (v.host, v.placed, v.spares) == ("b", "b", ["a"])
