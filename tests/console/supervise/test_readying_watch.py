"""A host a recovery readies is watched for reachability although a job already has it.

The reachability check probes hosts no job runs on; a host a recovery readies (a replica
copied there, an executor being started) already has the job, and no executor reports from
it yet, so nothing watched it: a target that died meanwhile was never found down, and the
recovery waited out its copy's timeouts (CI, 66f8b2d: the host-lost case of
test_frozen_target.py timed out). ``fleet.readying`` puts it back under the check.

Real controller and local hosts; a host made unreachable as the demo's kill does."""

from __future__ import annotations

import asyncio
from pathlib import Path

from support.fleetbed import local_host, until, write_inventory

from console.controller import Controller
from console.inventory import load
from console.states import HostState
from console.supervise.policy import Policy
from console.supervise.unless_down import HostLost, unless_down


async def test_a_host_being_readied_is_found_down_and_its_work_given_up(tmp_path: Path) -> None:
    inventory = write_inventory(
        tmp_path / "inventory.toml",
        hosts={"a": local_host(tmp_path / "a"), "b": local_host(tmp_path / "b")},
        jobs={},
    )
    ctl = Controller(load(inventory), Policy.AUTO)
    monitor = asyncio.create_task(ctl.monitor.run())
    hang = asyncio.Event()
    try:
        await until(lambda: ctl.fleet.hosts["b"].last_seen > 0, 30, "b probed once")
        ctl.fleet.hosts["b"].job = "j"  # a recovery has chosen it and readies it
        ctl.kill_host("b")
        lost = None
        try:
            await asyncio.wait_for(unless_down(ctl.fleet, "b", hang.wait()), 30)
        except HostLost as e:
            lost = e.host
        assert lost == "b", "the work on b was given up once b was found down"
        assert ctl.fleet.hosts["b"].state is HostState.DOWN
        assert "b" not in ctl.fleet.readying, "no longer watched once given up"
    finally:
        monitor.cancel()
        await asyncio.gather(monitor, return_exceptions=True)
        await ctl.close()
