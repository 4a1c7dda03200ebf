"""A job whose only spare is gone gets a provisioned host: the provisioner (the shipped local
example) makes one, the console adds it to the inventory file and the fleet, the spare keeper
makes it the job's spare and sends it the newest checkpoint, and when the job's host is then
killed the job fails over there and finishes bit-exact; it then has no spare again, and
another host is made for it. Once the job is over, both are idle: their release command runs
and their tables leave the inventory.

Evidence: the inventory file on disk, the replica bytes on the new host, the journal, and the
final parameters against the uninterrupted run's."""

from __future__ import annotations

import asyncio
import sys
import tomllib
from pathlib import Path

import pytest
from support.fleetbed import (
    EXECUTOR_ENV,
    add_provisioner,
    baseline_sha,
    job_table,
    local_host,
    until,
    write_inventory,
)

from console.controller import Controller
from console.inventory import load
from console.records.journal import Kind, read
from console.states import JobState
from console.supervise.policy import Policy

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.long  # test_provision_ssh proves the same over sshd; this adds the second host
async def test_a_job_whose_spare_is_gone_fails_over_to_a_provisioned_host_bit_exact(
    tmp_path: Path,
) -> None:
    inventory = write_inventory(
        tmp_path / "inventory.toml",
        hosts={"a": local_host(tmp_path / "a"), "b": local_host(tmp_path / "b", role="spare")},
        jobs={"j": {"host": "a", "spares": ["b"], **job_table(steps=10_000)}},
    )
    hosts = tmp_path / "p"  # short: an executor socket under it fits in 107 bytes
    local = [sys.executable, str(ROOT / "examples" / "provision_local.py"), "--root", str(hosts)]
    add_provisioner(
        inventory,
        [*local, "--region", "r1"],
        [*local, "--release"],
        retry_s=0.5,
        idle_release_s=1.0,
    )
    sha = baseline_sha(inventory, "j", tmp_path / "baseline")
    env = {h: dict(EXECUTOR_ENV) for h in ("a", "b", "prov-1")}
    ctl = Controller(load(inventory), Policy.AUTO, executor_env=env)
    sup = ctl.jobs["j"]
    task = asyncio.create_task(ctl.run(stay=True))
    try:
        await until(lambda: sup.step >= 50 or task.done(), 90, "step 50 on a")
        ctl.kill_host("b")  # the only spare is gone
        await until(lambda: sup.spares == ["prov-1"] or task.done(), 60, "prov-1 the spare")
        await until(
            lambda: any((hosts / "prov-1" / "replicas" / "j").glob("step-*.json")) or task.done(),
            60,
            "a replica on prov-1",
        )
        assert not task.done(), task
        ctl.kill_host("a")
        await until(lambda: sup.state.is_terminal() or task.done(), 240, "the job to end")
        # idle once the job is over: both given back, their tables out of the inventory
        await until(
            lambda: all(ctl.store.host(h).released for h in ("prov-1", "prov-2")),
            30,
            "both provisioned hosts released",
        )
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await ctl.close()
    assert sup.state is JobState.FINISHED, sup.live.why
    assert sup.host == "prov-1"
    assert sup.sha256 == sha, "the same parameters as the uninterrupted run"
    assert set(tomllib.loads(inventory.read_text())["hosts"]) == {"a", "b"}
    assert not (hosts / "prov-1").exists() and not (hosts / "prov-2").exists()
    assert ctl.fleet.hosts["prov-1"].state.value == "cordoned"
    journal = list(read(tmp_path / "state" / "journal.jsonl"))
    added = [e for e in journal if e.kind is Kind.ACTION and e.msg == "add host prov-1"]
    assert added, "added to the inventory and the fleet as n adds a host"
    done = [e for e in journal if e.kind is Kind.ACTION and e.data.get("provision") == "done"]
    # after the failover the job had no spare again (a is dead): a second host was made for
    # it, and no more (max_hosts = 2 by default)
    assert [e.data["host"] for e in done] == ["prov-1", "prov-2"]
    assert ctl.store.host("prov-1").provisioned and ctl.store.host("prov-2").provisioned
    assert not ctl.store.host("a").provisioned


@pytest.mark.long  # the suite provisions for a short region (test_provisioner) and adds a provisioned host to the inventory file (test_provision_ssh)
async def test_min_spares_gets_a_region_a_host_of_its_own(tmp_path: Path) -> None:
    """``min_spares = {r2 = 1}``: the console provisions a host for r2 (the shipped local
    provisioner reads HOTSPARE_REGION), which lands in the inventory file and the fleet in r2."""
    inventory = write_inventory(
        tmp_path / "inventory.toml",
        hosts={"a": local_host(tmp_path / "a"), "b": local_host(tmp_path / "b", role="spare")},
        jobs={"j": {"host": "a", "spares": ["b"], **job_table(steps=100_000)}},
    )
    made = tmp_path / "p"  # short: an executor socket under it fits in 107 bytes
    local = [sys.executable, str(ROOT / "examples" / "provision_local.py"), "--root", str(made)]
    add_provisioner(inventory, local, min_spares={"r2": 1}, retry_s=0.5)
    ctl = Controller(load(inventory), Policy.AUTO, executor_env={"a": dict(EXECUTOR_ENV)})
    task = asyncio.create_task(ctl.run(stay=True))
    try:
        await until(lambda: "prov-1" in ctl.fleet.hosts or task.done(), 60, "a host for r2")
        assert not task.done(), task
    finally:
        ctl.stop_job("j")
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await ctl.close()
    on_disk = tomllib.loads(inventory.read_text())["hosts"]
    assert on_disk["prov-1"]["region"] == "r2"
    assert on_disk["prov-1"]["root"] == str(made / "prov-1")
    journal = list(read(tmp_path / "state" / "journal.jsonl"))
    starts = [e.data for e in journal if e.kind is Kind.ACTION and e.data.get("provision")]
    assert [d.get("region") for d in starts if d["provision"] == "start"] == ["r2"]
