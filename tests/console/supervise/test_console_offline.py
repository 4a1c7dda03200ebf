"""The console itself offline (every host unreachable at once) fails nothing over: a host is
declared lost past its lease only if the console still reaches some other host. Evidence: the
journal's job and host states and the executor processes in /proc.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from pathlib import Path

import pytest
from support.fleetbed import EXECUTOR_ENV, local_host, stdlib_job, until, write_inventory
from support.offlinebed import OFFLINE, executors_under

from console.controller import Controller
from console.inventory import load
from console.reach.transport.local import LocalTransport
from console.records.journal import Event, Kind
from console.states import JobState
from console.supervise.policy import Policy


@pytest.mark.long  # the suite cuts every link in network namespaces (test_console_offline_netns)
async def test_a_console_that_reaches_no_host_fails_nothing_over_and_carries_on_after(
    tmp_path: Path,
) -> None:
    inventory = write_inventory(
        tmp_path / "inventory.toml",
        hosts={
            "a": local_host(tmp_path / "a"),
            "b": local_host(tmp_path / "b", role="spare"),
            "c": local_host(tmp_path / "c", role="spare"),
        },
        # no warm standby: nothing may start on a spare while offline (a standby is started
        # before; tests/console/supervise/test_warm_standby_default.py covers it)
        jobs={
            "j": {"host": "a", "spares": ["b"], "warm_standby": False, **stdlib_job(steps=100_000)}
        },
    )
    env = {h: dict(EXECUTOR_ENV) for h in ("a", "b", "c")}
    ctl = Controller(load(inventory), Policy.AUTO, executor_env=env)
    sup = ctl.jobs["j"]
    events: list[Event] = []
    ctl.journal.subscribe(events.append)
    task = asyncio.create_task(ctl.run())
    try:
        await until(lambda: sup.step >= 20 or task.done(), 90, "step 20")
        assert not task.done(), task
        epoch = sup.epoch
        transports = [rt.transport for rt in ctl.fleet.hosts.values()]
        assert all(isinstance(t, LocalTransport) for t in transports)
        cut_at = len(events)
        for t in transports:
            t.set_down(True)  # type: ignore[attr-defined]
        await until(lambda: any(OFFLINE in e.msg for e in events) or task.done(), 60, "the alert")
        assert not task.done(), task
        while_offline = events[cut_at:]
        moves = [e.data["to"] for e in while_offline if e.kind is Kind.JOB_STATE]
        assert "failing_over" not in moves, moves
        downs = [e.msg for e in while_offline if e.kind is Kind.HOST_STATE and "-> down" in e.msg]
        assert not [m for m in downs if m.startswith("a:")], downs
        assert not executors_under(tmp_path / "b") and not executors_under(tmp_path / "c")
        for t in transports:
            t.set_down(False)  # type: ignore[attr-defined]
        resumed = sup.step
        await until(
            lambda: (sup.state is JobState.RUNNING and sup.step > resumed + 10) or task.done(),
            90,
            "training again",
        )
        assert not task.done(), task
        assert sup.host == "a" and sup.epoch >= epoch
        assert not executors_under(tmp_path / "b") and not executors_under(tmp_path / "c")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await ctl.close()
        for pid in executors_under(tmp_path):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
