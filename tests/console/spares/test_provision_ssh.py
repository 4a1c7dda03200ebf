"""Provisioning over real OpenSSH: a job on an sshd host with no spare gets a host the shipped
``examples/provision_sshd.py`` makes (a fresh sshd of its own, its host key appended to the
console's known_hosts), preflighted and deployed to over ssh before the fleet takes it; the
job's host then dies and the job finishes there bit-exact. Once the job is over, the idle
host is released: its sshd is gone from /proc, its folder and known_hosts line removed, its
table out of the inventory.

Evidence: /proc, the files on disk (known_hosts, inventory, the bundle marker), the journal,
and the final parameters against the uninterrupted run's."""

from __future__ import annotations

import asyncio
import subprocess
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import sshbed
from support.fleetbed import (
    EXECUTOR_ENV,
    add_provisioner,
    baseline_sha,
    stdlib_job,
    until,
    write_inventory,
)

from console.controller import Controller
from console.inventory import load
from console.reach.deploy import MARKER, build_bundle, bundle_dir
from console.records.journal import Kind, read
from console.states import JobState
from console.supervise.policy import Policy


@pytest.fixture
def bed() -> Iterator[sshbed.SshBed]:
    with sshbed.ssh_bed() as b:
        yield b


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


async def test_a_job_without_a_spare_gets_a_fresh_sshd_host_and_fails_over_to_it(
    bed: sshbed.SshBed, tmp_path: Path
) -> None:
    a = bed.host(name="a")
    inventory = write_inventory(
        tmp_path / "inventory.toml",
        hosts={"a": a.inventory_table("r1")},
        jobs={"j": {"host": "a", **stdlib_job(steps=3_000)}},
    )
    made = bed.folder / "provisioned"
    command, release = bed.sshd_provisioner(made)
    add_provisioner(inventory, command, release, max_hosts=1, retry_s=0.5, idle_release_s=1.0)
    # the uninterrupted run, beside this one (it takes as long as the job: about a third of
    # the test when run first)
    frozen = tmp_path / "baseline.toml"  # the console rewrites the inventory meanwhile
    frozen.write_text(inventory.read_text())
    baseline = asyncio.create_task(
        asyncio.to_thread(baseline_sha, frozen, "j", tmp_path / "baseline")
    )
    env = {h: dict(EXECUTOR_ENV) for h in ("a", "prov-1")}
    ctl = Controller(load(inventory), Policy.AUTO, executor_env=env)
    sup = ctl.jobs["j"]
    task = asyncio.create_task(ctl.run(stay=True))
    sshd_pid = 0
    try:
        await until(lambda: sup.spares == ["prov-1"] or task.done(), 120, "prov-1 the spare")
        sshd_pid = int((made / "prov-1" / "sshd.pid").read_text())
        assert _alive(sshd_pid), "prov-1 is a running sshd of its own"
        assert "prov-1" in bed.known_hosts.read_text(), "its host key is what the console trusts"
        marker = Path(bundle_dir(str(made / "prov-1" / "root"), build_bundle()), MARKER)
        assert marker.is_file(), "deployed over ssh before the job took it"
        await until(
            lambda: any((made / "prov-1/root/replicas/j").glob("step-*.json")) or task.done(),
            60,
            "a replica on prov-1",
        )
        assert not task.done(), task
        a.kill_all()  # the job's host dies: sshd and everything under its root
        await until(lambda: sup.state.is_terminal() or task.done(), 240, "the job to end")
        await until(lambda: ctl.store.host("prov-1").released, 30, "prov-1 released")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await ctl.close()
        for left in made.glob("prov-*"):  # a failed test leaves no sshd behind
            await asyncio.to_thread(subprocess.run, [*release, left.name], timeout=30, check=False)
    assert sup.state is JobState.FINISHED, sup.live.why
    assert sup.host == "prov-1"
    assert sup.sha256 == await baseline, "the same parameters as the uninterrupted run"
    assert not _alive(sshd_pid), "released: its sshd is gone"
    assert not (made / "prov-1").exists()
    assert "prov-1" not in bed.known_hosts.read_text()
    assert set(tomllib.loads(inventory.read_text())["hosts"]) == {"a"}
    journal = list(read(tmp_path / "state" / "journal.jsonl"))
    done = [e.data for e in journal if e.kind is Kind.ACTION and e.data.get("provision") == "done"]
    assert [d["host"] for d in done] == ["prov-1"], "max_hosts = 1: one made, no more"
    assert done[0]["preflight_s"] > 0 and done[0]["deploy_s"] > 0
