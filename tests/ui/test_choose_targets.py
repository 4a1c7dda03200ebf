"""The pick dialog (`t`) describes each host once: the job's own spare as ``its spare`` with its
replica, not the inventory's ``spare`` and then ``spare, replica ...`` (it read ``spare,
spare, no replica yet``)."""

from __future__ import annotations

from pathlib import Path

from fleetbed import job_table, local_host, write_inventory

from console.inventory import load
from console.jobs.controller import Controller
from console.jobs.policy import Policy
from console.ui.screens.choose import failover_targets


async def test_each_target_is_described_once(tmp_path: Path) -> None:
    inv = write_inventory(
        tmp_path / "inventory.toml",
        hosts={
            "a": local_host(tmp_path / "a"),
            "b": local_host(tmp_path / "b", role="spare"),
            "c": local_host(tmp_path / "c", region="r2", role="spare"),
            "d": local_host(tmp_path / "d", region="r2"),
        },
        jobs={"j": {"host": "a", "spares": ["b"], **job_table()}},
    )
    ctl = Controller(load(inv), Policy.MANUAL)
    try:
        live = ctl.jobs["j"].live
        live.host, live.spares = "a", ["b"]  # as a running console has them
        targets = failover_targets(ctl, "j")
    finally:
        await ctl.close()
    assert targets == [
        ("b", "r1, its spare, no replica yet"),
        ("c", "r2, spare"),
        ("d", "r2, primary"),
    ]
