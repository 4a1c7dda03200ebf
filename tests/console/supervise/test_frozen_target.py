"""A recovery whose first choice of target freezes with the fault: the job's first spare is
SIGSTOPped (its sshd and every session on it: a host whose kernel hangs, connections open,
nothing answers) at the moment the job's host fails. Nothing says the spare is gone yet, so
the recovery chooses it; once the fleet finds it down, the recovery gives it up and the job
moves to its other spare.

- A planned move (GPU FAIL): the checkpoint at the stop reaches the second spare, 0 lost steps.
- A host killed (the lease is waited out, and the target readied meanwhile): the readying
  on the frozen spare is given up, not waited for.

Found by the provisioning MTTR benchmark: the checkpoint at a planned stop was copied to
every spare, one after another, before the failover chose its target, so a spare that had
died with the fault held the move up for its copy attempts' timeouts; and a target found
down while the recovery readied it was still waited on (a copy to a frozen host waits out
``command_timeout_s`` per attempt, here 300 s, so the old code did not move within 120 s).

Real sshd hosts. Evidence: the journal's decisions, the stop's checkpoint on the second
spare's disk, and the incident's lost steps."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from support import sshbed
from support.fleetbed import EXECUTOR_ENV, stdlib_job, until, write_inventory

from console.controller import Controller
from console.inventory import load
from console.reach.deploy import replica_file
from console.records.incidents import Incident, incidents
from console.records.journal import Event, Kind, read
from console.supervise.policy import Policy
from executors.testing.gpu_fake import write_state

FAILED = {"devices": [{"name": "Fake H100", "temp_c": 50, "ecc_uncorrected": 2, "xids": [79]}]}


@pytest.fixture
def bed() -> Iterator[sshbed.SshBed]:
    with sshbed.ssh_bed() as b:
        yield b


async def _fault_with_b_frozen(
    bed: sshbed.SshBed, tmp_path: Path, fault: str
) -> tuple[Incident, list[Event], sshbed.SshHost, str | None]:
    """Train on a with spares b then c, freeze b and fail a (``gpu`` or ``kill``); the
    incident, the journal and c once the job's first step after it is done, and its host."""
    a, b, c = (bed.host(name=n) for n in ("a", "b", "c"))
    nvml = tmp_path / "nvml-a.json"
    write_state(nvml, {"devices": [{"name": "Fake H100", "temp_c": 50}]})
    inventory = write_inventory(
        tmp_path / "inventory.toml",
        hosts={
            "a": a.inventory_table("r1"),
            "b": b.inventory_table("r1", role="spare", priority=1),
            "c": c.inventory_table("r1", role="spare", priority=2),
        },
        # a target readied during the lease wait (no warm standby readied on b before)
        jobs={
            "j": {
                "host": "a",
                "spares": ["b", "c"],
                "warm_standby": False,
                **stdlib_job(steps=100_000),
            }
        },
        command_timeout_s=300.0,  # a copy to the frozen spare hangs long past the move
    )
    env = {h: dict(EXECUTOR_ENV) for h in "abc"}
    env["a"]["HOTSPARE_FAKE_NVML"] = str(nvml)
    ctl = Controller(load(inventory), Policy.AUTO, executor_env=env)
    sup = ctl.jobs["j"]
    journal = tmp_path / "state" / "journal.jsonl"
    task = asyncio.create_task(ctl.run(stay=True))
    frozen: list[psutil.Process] = []
    try:
        await until(
            lambda: (
                (
                    sup.step >= 40
                    and ctl.replicator.replica("j", "b").manifest
                    and ctl.replicator.replica("j", "c").manifest
                )
                or task.done()
            ),
            120,
            "step 40 and replicas on b and c",
        )
        assert not task.done(), task
        frozen = b.processes()  # b's sshd and every session on it
        for p in frozen:
            with contextlib.suppress(psutil.NoSuchProcess):  # a session that just ended
                p.suspend()
        if fault == "gpu":
            write_state(nvml, FAILED)
        else:
            a.kill_all()
        await until(
            lambda: any(i.resolved for i in incidents(read(journal))) or task.done(),
            120,
            "the first step after the fault",
        )
    finally:
        for p in frozen:
            with contextlib.suppress(psutil.Error):
                p.resume()
        ctl.stop_job("j")
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await ctl.close()
    events = list(read(journal))
    (inc,) = incidents(events)
    return inc, events, c, sup.host


@pytest.mark.long  # the suite proves it for a host lost (in this file), on the same readying path
async def test_a_planned_move_gives_up_a_target_frozen_with_the_fault(
    bed: sshbed.SshBed, tmp_path: Path
) -> None:
    inc, events, c, host = await _fault_with_b_frozen(bed, tmp_path, "gpu")
    assert inc.fault_class == "gpu_fail" and host == "c"
    assert inc.lost_steps == 0, "c got the checkpoint at the stop"
    stop = max(
        e.data["step"]
        for e in events
        if e.kind is Kind.EXECUTOR and e.data.get("exit") == "planned"
    )
    on_c = Path(replica_file(str(c.root), "j", stop))
    assert on_c.is_file() and on_c.with_suffix(".json").is_file(), "the stop's checkpoint is on c"
    decided = [
        e.data.get("host")
        for e in events
        if e.kind is Kind.INCIDENT and e.data.get("phase") == "decided"
    ]
    assert decided == ["b", "c"], "b chosen first (not yet known down), then c"
    assert any(
        e.kind is Kind.ACTION and e.host == "b" and "lost while the failover readied it" in e.msg
        for e in events
    )


async def test_a_host_lost_gives_up_readying_a_target_frozen_with_the_fault(
    bed: sshbed.SshBed, tmp_path: Path
) -> None:
    inc, events, _, host = await _fault_with_b_frozen(bed, tmp_path, "kill")
    assert inc.fault_class == "host_lost" and host == "c"
    assert any(
        e.kind is Kind.ACTION and e.host == "b" and "lost while it was readied" in e.msg
        for e in events
    ), "the readying on b, chosen during the lease wait, was given up"
    started = [e.host for e in events if e.kind is Kind.EXECUTOR and "started on" in e.msg]
    assert "b" not in started
