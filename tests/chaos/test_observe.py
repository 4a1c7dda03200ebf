"""The harness's reading of the journal: where a job is placed (as the schedule aims faults),
and which incident records which fault."""

from __future__ import annotations

from pathlib import Path

import msgspec

from chaos import invariants as inv
from chaos.faults import Injected
from chaos.faults_fencing import holds_state_dir, lease_bound
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


def _incident(n: int, t: float, host: str, cls: str, resolved: float) -> list[Event]:
    """Incident ``n`` of j on ``host``, detected at ``t``, its first step at ``resolved``."""
    mark = {"phase": "detected", "class": cls, "fault_at": t, "last_step": 40}
    return [
        Event(t=t, kind=Kind.INCIDENT, job="j", host=host, incident=n, data=mark),
        Event(t=t + 0.1, kind=Kind.INCIDENT, job="j", incident=n, data={"phase": "decided"}),
        Event(
            t=t + 0.2, kind=Kind.INCIDENT, job="j", incident=n, data={"phase": "loaded", "step": 40}
        ),
        Event(t=resolved, kind=Kind.INCIDENT, job="j", incident=n, data={"phase": "first_step"}),
    ]


def test_a_console_restarted_soon_after_another_is_matched_to_its_own_console() -> None:
    """Chaos seed 49 of the 200-fault torchrun run at a44d1cf: two console restarts 2.9 s
    apart; the first one's console started 1.8 s before the second was injected, within the
    slack the second's window took from its start, so the second's incident (opened 1 s after
    it by its own console) fell outside its window: "no console_restart incident". A console
    restart's own console starts after its injection (the injector kills, then starts)."""
    events = [*_console_restart(6, 101.19), *_console_restart(7, 103.97)]
    report = "| 6 | j | c | console_restart |\n| 7 | j | c | console_restart |"
    first = Injected("console_restart", "j", "c", 100.1, ("console_restart",), recovered_at=101.8)
    second = Injected("console_restart", "j", "c", 103.0, ("console_restart",), recovered_at=104.6)
    matches, leftover, _ = inv.match_incidents(events, [first, second], report)
    got = [(m.fault.t, m.ok, m.incident.id if m.incident else None) for m in matches]
    assert got == [(100.1, True, 6), (103.0, True, 7)], got
    assert leftover == []


def test_a_fault_seen_through_does_not_take_the_next_faults_incident() -> None:
    """Chaos seed 7 of the 60-fault torchrun run at bfbbf87: a corrupt_replica on b (host
    killed) overlapped by a console restart, both absorbed in the restart's incident and seen
    through at 42.8; a sigstop_past_lease on c at 43.9 (a fast job settles in a second) opened
    host_lost at 46.1, within the corrupt_replica's slack after its recovery: it took it, and
    the sigstop_past_lease was reported as having no incident."""
    events = [
        Event(t=0.0, kind=Kind.CONSOLE, msg="console started (policy auto)"),
        Event(t=36.88, kind=Kind.CONSOLE, msg="console started (policy auto)"),
        *_incident(3, 36.88, "b", "console_restart", 42.69),
        *_incident(4, 46.11, "c", "host_lost", 51.0),
    ]
    report = "| 3 | j | b | console_restart |\n| 4 | j | c | host_lost |"
    replica = Injected("corrupt_replica", "j", "b", 36.5, ("host_lost",), recovered_at=42.8)
    restart = Injected("console_restart", "j", "b", 36.8, ("console_restart",), recovered_at=42.8)
    replica.overlapped = restart.overlapped = True
    frozen = Injected(
        "sigstop_past_lease", "j", "c", 43.9, ("host_lost", "executor_hang"), recovered_at=51.2
    )
    matches, leftover, _ = inv.match_incidents(events, [replica, restart, frozen], report)
    got = {m.fault.kind: (m.ok, m.incident.id if m.incident else None) for m in matches}
    assert got == {
        "corrupt_replica": (True, None),  # absorbed: the restart's incident was open
        "console_restart": (True, 3),
        "sigstop_past_lease": (True, 4),
    }, got
    assert leftover == []


def test_a_restarted_consoles_wait_is_judged_against_a_lease_not_a_bound_written_ahead() -> None:
    """Chaos seed 5 of the same run: the console persists its lease bound a third of a lease
    ahead of the leases it grants (fewer writes); a console started after it waits the bound
    but never more than a whole lease from its own start (JobLease.restore), and the harness
    called a new epoch 0.14 s before the persisted bound a violation, though it began after
    every lease the dead console could have granted (each runs from a reading that arrived
    before its death)."""
    ahead = {"until": 104.0, "ttl_s": 3.0}  # killed at 100.0: its last lease ends by 103.0
    assert lease_bound(ahead, killed=100.0) == 103.0
    behind = {"until": 101.5, "ttl_s": 3.0}  # the last lease granted 1.5 s before the kill
    assert lease_bound(behind, killed=100.0) == 101.5
    long = {"until": 150.0, "ttl_s": 60.0}  # a clean quit's unattended lease is waited whole
    assert lease_bound(long, killed=100.0) == 150.0


def test_a_second_console_waits_until_the_first_holds_the_state_dir(tmp_path: Path) -> None:
    """Chaos seed 8 of the mixed run at bf695b3: a second_console overlapped on a console
    restart started while the restarted console was still importing; it won the state dir,
    and the restarted console was refused. The injector now waits until the console it is
    a second to has journalled its start (only the holder writes the journal)."""
    started = Event(t=1.0, kind=Kind.CONSOLE, msg="console started", data={"pid": 31043})
    (tmp_path / "journal.jsonl").write_bytes(msgspec.json.encode(started) + b"\n")
    assert holds_state_dir(tmp_path, 31043)
    assert not holds_state_dir(tmp_path, 31241)
    assert not holds_state_dir(tmp_path / "none", 31043)
