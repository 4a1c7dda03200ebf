"""A cancel is never lost in the starvation yardstick (``console.fleet.starvation.start_time``).

Found in a fresh-clone run (test_a_stop_with_no_executor_to_tell_is_kept_not_lost, pytest-timeout
at 300 s): the console's quit cancelled its host monitor, whose reachability loop was timing a
Python's start just then; ``asyncio.wait_for`` (Python 3.11) returned the process's exit and
dropped the cancel when both came in the same turn of the loop, so the loop went on probing
for ever and the quit never returned. Here the two are made to come in the same turn."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from console.fleet import starvation


class _Proc:
    """A started program whose end the test decides."""

    def __init__(self) -> None:
        self.ended: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    async def wait(self) -> int:
        return await asyncio.shield(self.ended)  # as a real wait: a cancelled wait ends nothing

    def kill(self) -> None:
        if not self.ended.done():
            self.ended.set_result(-9)


@pytest.mark.parametrize("turns", range(8))
async def test_a_cancel_that_comes_as_the_yardstick_ends_is_kept(
    monkeypatch: pytest.MonkeyPatch, turns: int
) -> None:
    """The program ends, and ``turns`` turns of the loop later the task is cancelled: every
    interleaving of the two, those that lost the cancel included (turns 1 to 3 with
    ``wait_for``)."""
    proc = _Proc()

    async def exec_(*args: Any, **kw: Any) -> _Proc:
        return proc

    monkeypatch.setattr(asyncio, "create_subprocess_exec", exec_)
    task = asyncio.create_task(starvation.start_time(limit_s=10.0))
    for _ in range(3):  # into the wait for the program's end
        await asyncio.sleep(0)
    assert not task.done()
    proc.ended.set_result(0)
    for _ in range(turns):
        await asyncio.sleep(0)
    if task.done():  # it returned before the cancel: nothing to lose
        assert turns >= 2 and task.result() >= 0.0
        return
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert task.cancelled()


async def test_the_yardstick_still_times_a_start_and_cuts_off_a_slow_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert 0.0 < await starvation.start_time(limit_s=10.0) < 10.0
    proc = _Proc()

    async def exec_(*args: Any, **kw: Any) -> _Proc:
        return proc

    monkeypatch.setattr(asyncio, "create_subprocess_exec", exec_)
    assert await starvation.start_time(limit_s=0.05) == 0.05
    assert proc.ended.result() == -9, "the program cut off is killed"
