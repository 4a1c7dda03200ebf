"""The pick dialog (`t`) describes each host once: the job's own spare as ``its spare`` with its
replica, not the inventory's ``spare`` and then ``spare, replica ...`` (it read ``spare,
spare, no replica yet``)."""

from __future__ import annotations

from pathlib import Path

from support.fleetbed import job_table, local_host, write_inventory

from console.controller import Controller
from console.inventory import load
from console.spares.targets import Targets
from console.states import HostState, JobState
from console.supervise.policy import Policy
from console.ui.targets import failover_confirm, failover_targets


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


async def test_f_asks_about_the_host_the_console_s_own_failover_would_choose(
    tmp_path: Path,
) -> None:
    """``f`` names its target (``Fail j over to c (...) now?``), and it is the host
    ``Targets.pick`` takes: the job's own spare first; with it down, a free host before
    another job's spare, even a nearer one; with none, the question says it would wait."""
    inv = write_inventory(
        tmp_path / "inventory.toml",
        hosts={
            "a": local_host(tmp_path / "a"),
            "b": local_host(tmp_path / "b", role="spare"),
            "k": local_host(tmp_path / "k"),
            "c": local_host(tmp_path / "c", region="r2", role="spare"),
            "z": local_host(tmp_path / "z", role="spare"),
        },
        jobs={
            "j": {"host": "a", "spares": ["b"], **job_table()},
            "other": {"host": "k", "spares": ["z"], **job_table()},
        },
    )
    ctl = Controller(load(inv), Policy.MANUAL)
    try:
        for name, host, spares in (("j", "a", ["b"]), ("other", "k", ["z"])):
            live = ctl.jobs[name].live
            live.host, live.spares = host, spares  # as a running console has them
            live.machine.move(JobState.DEPLOYING)
            live.machine.move(JobState.RUNNING)
            ctl.fleet.hosts[host].job = name
        targets = Targets(
            ctl.jobs["j"].live,
            inv=ctl.inv,
            fleet=ctl.fleet,
            replicator=ctl.replicator,
            reserved=lambda: ctl.reserved("j"),
        )
        asked = [failover_confirm(ctl, "j")]
        picked = [await targets.pick("a")]
        j = ctl.jobs["j"].live.machine
        j.move(JobState.RESTARTING)  # the move is kept until the job trains: the question says so
        restarting = failover_confirm(ctl, "j")
        j.move(JobState.DEPLOYING)
        j.move(JobState.RUNNING)
        ctl.fleet.set_state("b", HostState.DOWN, "lost, for the test")
        asked.append(failover_confirm(ctl, "j"))
        picked.append(await targets.pick("a"))
        ctl.fleet.set_state("c", HostState.DOWN, "lost, for the test")
        asked.append(failover_confirm(ctl, "j"))
        picked.append(await targets.pick("a"))
    finally:
        await ctl.close()
    assert asked == [
        "Fail j over to b (r1, its spare, no replica yet) now?",
        "Fail j over to c (r2, spare) now?",  # z is nearer, but other's spare
        "Fail j over? No host can take it now: it waits for one.",
    ]
    assert picked == ["b", "c", None]
    assert restarting == (
        "Fail j over to b (r1, its spare, no replica yet) once it trains? It is restarting."
    )
