"""An operator's fail over (``f``) of a multi-host job: its move is refused, said and
journalled as refused; a failover of the group waiting for approval is approved by it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from support.groupbed import local_group

from console.controller import Controller
from console.inventory import load
from console.records.journal import Event, Kind
from console.supervise.policy import Policy
from console.supervise.refusal import Refused


async def test_a_groups_fail_over_is_refused_and_its_pending_failover_approved(
    tmp_path: Path,
) -> None:
    """Before: the Drain stopped every member at a step and, every host still fit, the next
    epoch started on the same hosts; the journal said ``fail over j`` was done."""
    ctl = Controller(load(local_group(tmp_path)), Policy.MANUAL)
    events: list[Event] = []
    ctl.journal.subscribe(events.append)
    why = "j trains on several hosts: drain the host of the member to move"
    with pytest.raises(Refused, match=why):
        ctl.fail_over("j")
    assert [(e.msg, e.data.get("refused")) for e in events if e.kind is Kind.ACTION] == [
        (f"fail over j: refused ({why})", why)
    ]
    sup = ctl.jobs["j"]
    sup.live.approval = asyncio.get_running_loop().create_future()
    ctl.fail_over("j")
    assert sup.live.approval.result() is True, "the failover waiting for approval goes ahead"
    await ctl.close()
