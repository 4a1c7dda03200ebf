"""A warm standby the failover does not take says why in the journal (an operator reading
"executor started on b" twice needs to know why the first was not used), no process started:
its link gone, its host unfit, or taken by another job."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support.jobbed import Calls, services

from console.fleet.link import LinkError
from console.records.journal import Kind, read
from console.states import HostState
from console.supervise.standby import Prepared
from console.supervise.supervisor import Supervisor


class GoneLink:
    """A standby's link that has closed: no Hello, nothing can be sent."""

    hello = None

    async def send(self, msg: Any) -> None:
        raise LinkError("closed")

    def close(self) -> None:
        pass

    async def finish(self, timeout: float = 0.0) -> None:
        pass


@pytest.mark.parametrize(
    ("case", "why"),
    [
        ("link gone", "its link is gone"),
        ("host cordoned", "c is cordoned"),
        ("taken", "c was taken by job other"),
    ],
)
async def test_a_warm_standby_not_taken_for_the_failover_is_journalled_with_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str, why: str
) -> None:
    svc = services(tmp_path, Calls())
    for h in "abc":
        svc.fleet.set_state(h, HostState.UP, "test")
    sup = Supervisor(svc, "j")
    sup._assign_members(["a"])
    standby = sup._standby
    monkeypatch.setattr(standby, "pumping", lambda link: case != "link gone")

    async def gone(host: str) -> bool:
        return True

    monkeypatch.setattr(standby._probe, "wait_gone", gone)
    if case == "host cordoned":
        svc.fleet.set_state("c", HostState.CORDONED, "test")
    if case == "taken":
        svc.fleet.hosts["c"].job = "other"
    standby.warm = Prepared("c", GoneLink())  # type: ignore[arg-type]
    assert await standby.take_warm("c") is None  # the job's rank placed on c
    assert standby.warm is None
    svc.journal.flush()
    said = [
        e.msg
        for e in read(svc.inv.state_dir / "journal.jsonl")
        if e.kind is Kind.EXECUTOR and "is not used" in e.msg
    ]
    assert said == [f"j: the warm standby on c is not used: {why}"]
