"""A console whose jobs all ended waits for the copies still under way before it closes, so a
job's last checkpoint reaches its spares; but not for a copy to a spare that does not answer
(``hotspare run`` waited out the whole minute for one). The copies here are held in flight by
the test (a transfer that has not ended), the spares' answering is the host monitor's reading
as the controller gives it; the evidence is the journal and which copies had ended."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from support.fleetbed import until
from support.replicabed import Bed

from console.records.journal import Event, Kind
from console.replication.replicator import Source


@dataclass
class Held:
    """A console whose replicator's copies are held in flight until the test releases each
    spare's; the spares whose copy started and ended, and what the journal said."""

    bed: Bed
    release: dict[str, asyncio.Event] = field(
        default_factory=lambda: {h: asyncio.Event() for h in ("b", "c")}
    )
    started: list[str] = field(default_factory=list)
    ended: list[str] = field(default_factory=list)
    seen: list[Event] = field(default_factory=list)

    async def copy(self, job: str, spare: str, source: Source, saved_at: float) -> bool:
        self.started.append(spare)
        await self.release[spare].wait()
        self.ended.append(spare)
        return True

    async def under_way(self, *spares: str) -> None:
        self.bed.ctl.replicator.submit("j", list(spares), self.bed.source(100))
        await until(lambda: sorted(self.started) == sorted(spares), 10, "the copies under way")

    def cut(self) -> list[Event]:
        return [
            e
            for e in self.seen
            if e.kind is Kind.REPLICA and "is cut by the console's close" in e.msg
        ]


@pytest.fixture
async def held(tmp_path: Path) -> AsyncIterator[Held]:
    h = Held(Bed(tmp_path))
    h.bed.ctl.journal.subscribe(h.seen.append)
    h.bed.ctl.replicator.copy = h.copy  # type: ignore[method-assign]
    try:
        yield h
    finally:
        for event in h.release.values():
            event.set()
        await h.bed.ctl.close()


async def test_the_close_waits_for_a_spare_that_answers_and_not_for_one_that_does_not(
    held: Held,
) -> None:
    await held.under_way("b", "c")
    settling = asyncio.create_task(
        held.bed.ctl.replicator.settle(60, unreachable=lambda h: h == "c")
    )
    await until(lambda: bool(held.cut()), 10, "the copy to c cut at once")
    (line,) = held.cut()
    assert line.host == "c" and "c does not answer" in line.msg, line.msg
    assert not settling.done(), "b answers: its copy is waited for"
    held.release["b"].set()
    await asyncio.wait_for(settling, 10)  # at b's end, not the minute
    assert held.ended == ["b"] and len(held.cut()) == 1


async def test_a_spare_that_stops_answering_while_the_console_waits_is_waited_for_no_more(
    held: Held,
) -> None:
    silent: set[str] = set()
    asked: list[str] = []

    def unreachable(host: str) -> bool:
        asked.append(host)
        return host in silent

    await held.under_way("c")
    settling = asyncio.create_task(held.bed.ctl.replicator.settle(60, unreachable=unreachable))
    await until(lambda: len(asked) >= 2, 10, "c asked about twice while the console waits")
    assert not settling.done() and not held.cut(), "c answered: its copy was waited for"
    silent.add("c")  # the host monitor reads c down now
    await asyncio.wait_for(settling, 10)
    assert [e.host for e in held.cut()] == ["c"] and held.ended == []


async def test_a_copy_to_a_spare_that_answers_is_waited_for_up_to_the_bound_then_said_cut(
    held: Held,
) -> None:
    await held.under_way("b")
    await asyncio.wait_for(held.bed.ctl.replicator.settle(1.0), 10)
    (line,) = held.cut()
    assert line.host == "b" and "still under way 1 s after every job ended" in line.msg
    assert held.ended == []
