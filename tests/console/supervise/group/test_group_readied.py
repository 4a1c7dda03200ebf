"""A replacement readied for a group while a member's lease runs out: the host is the job's
while it starts (no other job's failover takes it), and when the member answers again (a
blip) the readying is called off, even mid-start: the executor it started is gone and the
host is free at once. The single host's readied target does the same
(``test_console_fencing``); one rule for both (issue 30). Real executors; evidence from
/proc and the fleet."""

from __future__ import annotations

import asyncio
from pathlib import Path

from support.fleetbed import until
from support.groupbed import controller, local_group

from console.records.journal import Kind
from console.supervise.member import Member


async def test_a_replacement_called_off_mid_start_stops_its_executor_and_frees_the_host(
    tmp_path: Path,
) -> None:
    ctl = controller(local_group(tmp_path))
    sup = ctl.jobs["j"]
    started: list[int] = []
    ctl.journal.subscribe(
        lambda e: (
            started.append(e.data["pid"])
            if e.kind is Kind.EXECUTOR and e.host == "d" and "started on" in e.msg
            else None
        )
    )
    try:
        sup._assign_members(["a", "b", "c"])  # placed: d is its spare
        assert sup.live.spares == ["d"]
        sup._executors.ready_replacement(Member(2, "c"))  # c cannot be reached
        assert ctl.fleet.hosts["d"].job == "j", "the host is the job's while it is readied"
        assert "d" not in ctl.fleet.usable()
        await until(lambda: started, 60, "an executor started on d")
        sup._executors.call_off("c answers again")  # mid-start: its Hello may not be read yet
        await sup._executors.drop_readied([])
        assert ctl.fleet.hosts["d"].job is None, "the host is free again at once"
        assert "d" in ctl.fleet.usable()
        await until(lambda: not Path(f"/proc/{started[0]}").exists(), 60, "its executor gone")
    finally:
        await asyncio.wait_for(ctl.close(), 60)
