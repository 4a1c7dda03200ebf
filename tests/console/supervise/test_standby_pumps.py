"""A link's reader is found by the link, never by its id: a new link that CPython places where a
freed one was (the same ``id``) is pumped all the same. Found by fresh-clone runs: a warm
standby that had just come up read as "its link is gone" (its reader never started: the freed
link's finished one stood under its id) and a second executor was started beside it."""

from __future__ import annotations

import asyncio
import gc
from typing import Any, cast

import pytest

from console.fleet.link import ExecutorLink
from console.supervise.standby import Standby


class Link:
    """What ``Standby.pump`` uses of an ExecutorLink: its Hello and its ``pump``."""

    def __init__(self, ends_at_once: bool) -> None:
        self.hello = object()
        self.ends_at_once = ends_at_once
        self.reading = asyncio.Event()

    async def pump(self, on_message: Any) -> str:
        if not self.ends_at_once:
            self.reading.set()
            await asyncio.Event().wait()
        return "the executor closed the connection"


async def test_a_new_link_where_a_freed_one_was_is_pumped() -> None:
    standby = Standby(cast(Any, None), **dict.fromkeys(
        ("fleet", "journal", "launcher", "probe"),
        cast(Any, None),
    ))  # fmt: skip
    first = Link(ends_at_once=True)
    await standby.pump(cast(ExecutorLink, first))  # its reader ends: the link is closed
    other = Link(ends_at_once=False)
    tasks = [standby.pump(cast(ExecutorLink, other))]  # a finished reader may be dropped now
    old = id(first)
    gc.disable()  # no collection in between may take the freed place first
    try:
        del first  # freed here, nothing else holding it: the next link of its size takes it
        kept: list[Link] = []  # every miss stays alive, so the next one is placed elsewhere
        candidate = Link(ends_at_once=False)
        while id(candidate) != old and len(kept) < 10_000:
            kept.append(candidate)
            candidate = Link(ends_at_once=False)
    finally:
        gc.enable()
    if id(candidate) != old:  # a fresh-clone suite run once: another object took the place
        pytest.skip("no new link was placed where the freed one was: nothing to show")
    tasks.append(standby.pump(cast(ExecutorLink, candidate)))
    try:
        await asyncio.wait_for(candidate.reading.wait(), 5)  # its own reader runs
        assert standby.pumping(cast(ExecutorLink, candidate))
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
