"""The harness's reading of the journal: where a job is placed (as the schedule aims faults),
and which incident records which fault."""

from __future__ import annotations

from chaos import invariants as inv
from chaos.faults import Injected
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


def _console_restart(n: int, t: float) -> list[Event]:
    """A console started at ``t`` and the console_restart incident it opened for j."""
    mark = {"phase": "detected", "class": "console_restart", "fault_at": t, "last_step": 40}
    return [
        Event(t=t, kind=Kind.CONSOLE, msg="console started (policy auto)"),
        Event(t=t, kind=Kind.INCIDENT, job="j", host="c", incident=n, data=mark),
        Event(t=t + 0.1, kind=Kind.INCIDENT, job="j", incident=n, data={"phase": "decided"}),
        Event(
            t=t + 0.2, kind=Kind.INCIDENT, job="j", incident=n, data={"phase": "loaded", "step": 40}
        ),
        Event(t=t + 0.5, kind=Kind.INCIDENT, job="j", incident=n, data={"phase": "first_step"}),
    ]


def test_each_console_restart_is_matched_to_the_incident_its_own_console_opened() -> None:
    """Chaos seed 90 at 3a10194: an overlapped console_restart_partitioned (its console opened
    nothing for j, whose incident was open and carried on) kept a window long enough to take
    the incident of a console restart 57 s later, and the restart after that one was then
    reported as having none."""
    gpu_fail = {"phase": "detected", "class": "gpu_fail", "fault_at": 0.5, "last_step": 40}
    events = [
        Event(t=0.0, kind=Kind.CONSOLE, msg="console started (policy auto)"),
        Event(t=0.5, kind=Kind.INCIDENT, job="j", host="b", incident=5, data=gpu_fail),
        Event(t=2.0, kind=Kind.CONSOLE, msg="console started (policy auto)"),
        Event(
            t=55.0, kind=Kind.INCIDENT, job="j", incident=5, data={"phase": "loaded", "step": 40}
        ),
        Event(t=55.5, kind=Kind.INCIDENT, job="j", incident=5, data={"phase": "first_step"}),
        *_console_restart(8, 59.0),
        *_console_restart(9, 61.5),
    ]
    report = (
        "| 5 | j | b | gpu_fail |\n| 8 | j | c | console_restart |\n| 9 | j | c | console_restart |"
    )
    partitioned = Injected(
        "console_restart_partitioned",
        "j",
        "a",
        1.0,
        ("host_lost", "console_restart"),
        overlapped=True,
        recovered_at=56.0,
    )
    first = Injected("console_restart", "j", "c", 58.0, ("console_restart",), recovered_at=59.6)
    second = Injected("console_restart", "j", "c", 61.1, ("console_restart",), recovered_at=62.0)
    matches, leftover, _ = inv.match_incidents(events, [partitioned, first, second], report)
    got = {
        m.fault.kind + str(m.fault.t): (m.ok, m.incident.id if m.incident else None)
        for m in matches
    }
    assert got == {
        "console_restart_partitioned1.0": (True, None),  # absorbed: j's incident 5 was open
        "console_restart58.0": (True, 8),
        "console_restart61.1": (True, 9),
    }, got
    assert leftover == [], "the GPU FAIL's incident is put down to the overlapped fault"
