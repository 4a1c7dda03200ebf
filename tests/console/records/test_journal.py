"""Reading a long journal back: the tail for recent history, every incident from the whole file,
and whether the last console stopped cleanly, from the tail alone."""

from __future__ import annotations

import io
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from console.records.incidents import unclean_exit
from console.records.journal import Event, Journal, Kind, matching_lines, read
from console.records.timeline import Timeline


def long_journal(path: Path, progress: int) -> Journal:
    """An incident at the very start, then ``progress`` progress events, then a second one."""
    j = Journal(path)
    j.record(Kind.CONSOLE, "console started (policy auto)")
    j.record(Kind.INCIDENT, "first", job="j", host="a", incident=1, data={"phase": "detected"})
    for step in range(progress):
        j.record(Kind.PROGRESS, f"j: step {step}", job="j", data={"step": step})
    j.record(Kind.CHECKPOINT, "j: checkpoint", job="j", host="a", data={"step": progress})
    j.record(Kind.INCIDENT, "second", job="j", host="b", incident=2, data={"phase": "detected"})
    return j


def test_a_tail_read_starts_at_a_whole_event_and_reads_to_the_end(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    long_journal(path, 5000).close()
    size = path.stat().st_size
    tail = list(read(path, tail_bytes=10_000))
    whole = list(read(path))
    lines = path.read_bytes().splitlines(keepends=True)
    n = len(tail)
    assert 0 < n < 200
    assert tail == whole[-n:], "whole events, none torn, none missing, to the end"
    assert sum(map(len, lines[-n:])) <= 10_000 < sum(map(len, lines[-n - 1 :])), (
        "every event that starts in the last 10 kB, and no earlier one"
    )
    assert list(read(path, tail_bytes=size)) == list(read(path)), "a tail as big as the file"
    assert list(read(path, tail_bytes=size + 10)) == list(read(path))


def test_picking_kinds_out_of_the_whole_file_skips_lookalikes(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    j = long_journal(path, 300)
    # An event whose text and data look like an incident's on their bytes, but is not one.
    j.record(Kind.ALERT, '"kind":"incident"', data={"kind": "incident"})
    j.close()
    found = list(read(path, kinds=(Kind.INCIDENT,)))
    assert [e.msg for e in found] == ["first", "second"]
    assert [e.msg for e in read(path, kinds=(Kind.INCIDENT, Kind.CONSOLE))] == [
        "console started (policy auto)",
        "first",
        "second",
    ]
    assert list(read(tmp_path / "absent.jsonl", kinds=(Kind.INCIDENT,))) == []


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.sampled_from([b"ab", b"xNy", b"NN", b"", b"zzzzzzN", b"q"]), max_size=30),
    st.booleans(),
    st.integers(1, 12),
)
def test_lines_are_found_across_block_boundaries(
    lines: list[bytes], torn: bool, chunk: int
) -> None:
    data = b"".join(line + b"\n" for line in lines) + (b"Ntorn" if torn else b"")
    found = list(matching_lines(io.BytesIO(data), [b"N", b"zz"], chunk=chunk))
    assert found == [line + b"\n" for line in lines if b"N" in line or b"zz" in line]


def test_the_timeline_has_every_incident_and_the_recent_events_only(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    j = long_journal(path, 60_000)  # about 6 MB of progress (QUIET: not kept) ...
    for n in range(40_000):  # ... and 4 MB of checkpoints, more than the tail holds
        j.record(Kind.CHECKPOINT, f"c{n}", job="k", host="a", data={"step": n})
    timeline = Timeline(j)
    assert [i.id for i in timeline.incidents()] == [1, 2], "the first is 10 MB back"
    recent = timeline.for_job("k")
    assert recent[-1].msg == "c39999"
    assert len(recent) == 500
    j.record(Kind.INCIDENT, "third", job="k", host="a", incident=3, data={"phase": "detected"})
    assert [i.id for i in timeline.incidents()] == [1, 2, 3], "and new ones as they come"
    j.close()


def event(kind: Kind, msg: str = "", t: float = 1.0, **data: int) -> Event:
    return Event(t=t, kind=kind, msg=msg, job="j" if data else None, data=dict(data))


def test_an_unclean_exit_is_seen_from_a_tail_without_any_console_event() -> None:
    mid_run = [event(Kind.PROGRESS, t=5.0, step=7), event(Kind.CHECKPOINT, t=6.0, step=9)]
    assert unclean_exit(mid_run, whole=False) == (6.0, {"j": 9})
    assert unclean_exit(mid_run, whole=True) is None, "a whole journal with no console start"
    stopped = [*mid_run, event(Kind.CONSOLE, "console stopped", t=7.0)]
    assert unclean_exit(stopped, whole=False) is None
    assert unclean_exit([], whole=False) is None
    started = [event(Kind.CONSOLE, "console started (policy auto)"), *mid_run]
    assert unclean_exit(started) == (6.0, {"j": 9})
