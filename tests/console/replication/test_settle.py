"""A console whose jobs all ended waits for the copies still under way before it closes, so a
job's last checkpoint reaches its spares; but not for a copy to a spare that does not answer
(``hotspare run`` waited out the whole minute for one). The copies here are held in flight by
the test (a transfer that has not ended), the spares' answering is the host monitor's reading
as the controller gives it; the evidence is the journal and which copies had ended."""

from __future__ import annotations

import asyncio
from pathlib import Path

from support.fleetbed import until
from support.replicabed import Bed

from console.records.journal import Event, Kind
from console.replication.replicator import Source


def held(bed: Bed) -> tuple[dict[str, asyncio.Event], list[str], list[str]]:
    """The replicator's copies, held in flight until the test releases each spare's: the
    releases, the spares whose copy started, and those whose copy ended."""
    release = {h: asyncio.Event() for h in ("b", "c")}
    started: list[str] = []
    ended: list[str] = []

    async def copy(job: str, spare: str, source: Source, saved_at: float) -> bool:
        started.append(spare)
        await release[spare].wait()
        ended.append(spare)
        return True

    bed.ctl.replicator.copy = copy  # type: ignore[method-assign]
    return release, started, ended


def cut(seen: list[Event]) -> list[Event]:
    return [e for e in seen if e.kind is Kind.REPLICA and "is cut by the console's close" in e.msg]


async def test_the_close_waits_for_a_spare_that_answers_and_not_for_one_that_does_not(
    tmp_path: Path,
) -> None:
    bed = Bed(tmp_path)
    seen: list[Event] = []
    bed.ctl.journal.subscribe(seen.append)
    release, started, ended = held(bed)
    try:
        bed.ctl.replicator.submit("j", ["b", "c"], bed.source(100))
        await until(lambda: sorted(started) == ["b", "c"], 10, "both copies under way")
        settling = asyncio.create_task(
            bed.ctl.replicator.settle(60, unreachable=lambda h: h == "c")
        )
        await until(lambda: bool(cut(seen)), 10, "the copy to c cut at once")
        (line,) = cut(seen)
        assert line.host == "c" and "c does not answer" in line.msg, line.msg
        assert not settling.done(), "b answers: its copy is waited for"
        release["b"].set()
        await asyncio.wait_for(settling, 10)  # at b's end, not the minute
        assert ended == ["b"] and len(cut(seen)) == 1
    finally:
        for event in release.values():
            event.set()
        await bed.ctl.close()


async def test_a_spare_that_stops_answering_while_the_console_waits_is_waited_for_no_more(
    tmp_path: Path,
) -> None:
    bed = Bed(tmp_path)
    seen: list[Event] = []
    bed.ctl.journal.subscribe(seen.append)
    release, started, ended = held(bed)
    silent: set[str] = set()
    asked: list[str] = []

    def unreachable(host: str) -> bool:
        asked.append(host)
        return host in silent

    try:
        bed.ctl.replicator.submit("j", ["c"], bed.source(100))
        await until(lambda: started == ["c"], 10, "the copy under way")
        settling = asyncio.create_task(bed.ctl.replicator.settle(60, unreachable=unreachable))
        await until(lambda: len(asked) >= 2, 10, "c asked about twice while the console waits")
        assert not settling.done() and not cut(seen), "c answered: its copy was waited for"
        silent.add("c")  # the host monitor reads c down now
        await asyncio.wait_for(settling, 10)
        assert [e.host for e in cut(seen)] == ["c"] and ended == []
    finally:
        for event in release.values():
            event.set()
        await bed.ctl.close()


async def test_a_copy_to_a_spare_that_answers_is_waited_for_up_to_the_bound_then_said_cut(
    tmp_path: Path,
) -> None:
    bed = Bed(tmp_path)
    seen: list[Event] = []
    bed.ctl.journal.subscribe(seen.append)
    release, started, ended = held(bed)
    try:
        bed.ctl.replicator.submit("j", ["b"], bed.source(100))
        await until(lambda: started == ["b"], 10, "the copy under way")
        await asyncio.wait_for(bed.ctl.replicator.settle(1.0), 10)
        (line,) = cut(seen)
        assert line.host == "b" and "still under way 1 s after every job ended" in line.msg
        assert ended == []
    finally:
        for event in release.values():
            event.set()
        await bed.ctl.close()
