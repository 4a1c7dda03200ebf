"""A job whose only spare turns unhealthy (its GPU falls off the bus, as the fake NVML says)
gets a provisioned host: the console makes one (the shipped local provisioner), the spare
keeper puts it in the unhealthy spare's place, the newest checkpoint reaches it, and when the
job's host dies the job moves there, never to the unhealthy spare, and finishes bit-exact.

Evidence: the replica files on the new host's disk, the final parameters against the
uninterrupted run's, and nothing trained or written by the job on the unhealthy spare (the
standby a spare that turns unfit holds is stopped: test_spare_health)."""

from __future__ import annotations

import asyncio
import json
import sys
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
from console.states import JobState
from console.supervise.policy import Policy
from executors.testing.gpu_fake import write_state

ROOT = Path(__file__).resolve().parents[3]
LOCAL = ROOT / "examples" / "provision_local.py"
HEALTHY = {"devices": [{"name": "Fake H100", "temp_c": 45}]}


@pytest.mark.long  # the suite proves provisioning over sshd (test_provision_ssh) and an
# unfit spare's replacement (test_spare_keeper); this is the two together
async def test_a_job_whose_only_spare_turns_unhealthy_moves_to_a_provisioned_host(
    tmp_path: Path,
) -> None:
    inventory = write_inventory(
        tmp_path / "inventory.toml",
        hosts={"a": local_host(tmp_path / "a"), "b": local_host(tmp_path / "b", role="spare")},
        jobs={"j": {"host": "a", "spares": ["b"], **job_table(steps=10_000)}},
        health_probe_s=0.5,
    )
    made = tmp_path / "p"  # short: an executor socket under it fits in 107 bytes
    local = [sys.executable, str(LOCAL), "--root", str(made)]
    add_provisioner(
        inventory, [*local, "--region", "r1"], [*local, "--release"], max_hosts=1, retry_s=0.5
    )
    sha = baseline_sha(inventory, "j", tmp_path / "baseline")
    nvml = {h: tmp_path / f"nvml-{h}.json" for h in ("a", "b", "prov-1")}
    for path in nvml.values():
        write_state(path, HEALTHY)
    env = {h: {**EXECUTOR_ENV, "HOTSPARE_FAKE_NVML": str(p)} for h, p in nvml.items()}
    ctl = Controller(load(inventory), Policy.AUTO, executor_env=env)
    sup = ctl.jobs["j"]
    task = asyncio.create_task(ctl.run())
    try:
        await until(
            lambda: (sup.step >= 20 and ctl.fleet.hosts["b"].samples) or task.done(),
            90,
            "training, and b probed",
        )
        write_state(nvml["b"], {"devices": [{"name": "Fake H100", "lost": True}]})
        await until(lambda: sup.spares == ["prov-1"] or task.done(), 60, "prov-1 in b's place")
        await until(
            lambda: any((made / "prov-1" / "replicas" / "j").glob("step-*.json")) or task.done(),
            60,
            "a replica on prov-1",
        )
        assert not task.done(), task
        ctl.kill_host("a")
        await asyncio.wait_for(task, 240)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await ctl.close()
    assert sup.state is JobState.FINISHED, sup.live.why
    assert sup.host == "prov-1"
    assert sup.sha256 == sha, "the same parameters as the uninterrupted run"
    # the job never trained on b, wrote no checkpoint and reported no step there
    on_b = tmp_path / "b" / "jobs" / "j"
    assert not any(on_b.glob("checkpoints/step-*")), "the unhealthy spare never ran it"
    said = (on_b / "events.jsonl").read_text() if (on_b / "events.jsonl").exists() else ""
    kinds = {json.loads(line)["kind"] for line in said.splitlines() if line.strip()}
    assert not kinds & {"resumed", "progress", "checkpoint", "finished"}, kinds
