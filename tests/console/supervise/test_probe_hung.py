"""A silent executor still holding its lock past the lease is killed as hung, unless by the
kill nothing holds the lock: then it ended on its own and its events say how. Seen under two
busy loops: a group member finished, its link broke before the console read its Finished, it
was still exiting when probed; the kill found nothing, yet the member was called hung and the
finished group restarted in place from its final step, a second incident."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from support.fleetbed import local_host, write_inventory
from support.probebed import HOLD_LOCK

from console.inventory import load
from console.reach.transport.factory import open_transport
from console.records.journal import Journal
from console.supervise.outcome import Exit
from console.supervise.probe import Probe

FINISHED = {"kind": "finished", "step": 240, "params_sha256": "ab" * 32}


def probe_of(tmp_path: Path) -> tuple[Probe, Path]:
    inv = write_inventory(
        tmp_path / "inventory.toml", hosts={"a": local_host(tmp_path / "a")}, jobs={}
    )
    loaded = load(inv)
    transport = open_transport(loaded, "a")
    journal = Journal(tmp_path / "journal.jsonl")
    probe = Probe("j", inv=loaded, transport=lambda _h: transport, journal=journal, alert=print)
    workdir = Path(probe.workdir("a"))
    workdir.mkdir(parents=True)
    (workdir / "events.jsonl").write_text(json.dumps(FINISHED) + "\n")
    return probe, workdir


async def test_an_executor_gone_by_the_kill_ended_as_its_events_say(tmp_path: Path) -> None:
    probe, workdir = probe_of(tmp_path)
    outcome = await probe.hung("a", str(workdir))
    assert outcome.exit is Exit.FINISHED, outcome
    assert outcome.sha256 == FINISHED["params_sha256"]


async def test_an_executor_holding_its_lock_at_the_kill_is_killed_as_hung(tmp_path: Path) -> None:
    probe, workdir = probe_of(tmp_path)  # its events end "finished": the lock still decides
    holder = subprocess.Popen(  # noqa: ASYNC220 - one helper, killed by the probe or below
        [sys.executable, "-c", HOLD_LOCK, os.path.join(workdir, "executor.lock")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        (workdir / "executor.pid").write_text(f"{holder.pid}\n")
        outcome = await probe.hung("a", str(workdir))
        assert outcome.exit is Exit.HUNG, outcome
        assert holder.wait(10) == -9, "SIGKILLed by its recorded pid"
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(10)
