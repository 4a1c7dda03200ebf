"""A command-kind job whose script checkpoints with torch.distributed.checkpoint (a folder a
step: tests/train_dcp_plain.py) on local host ``a`` with spare ``b``: its folders are
replicated to ``b`` as folders, byte for byte, and when ``a`` dies the job finishes on ``b``
from the promoted folder with the parameters of an uninterrupted run.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
from support.fleetbed import local_host, until, write_inventory
from support.helpers import REPO

from console.controller import Controller
from console.inventory import load
from console.records.incidents import incidents
from console.records.journal import read
from console.states import JobState
from console.supervise.policy import Policy
from protocol.spec import CheckpointManifest

SCRIPT = REPO / "tests" / "train_dcp_plain.py"
STEPS = 80


def tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def command() -> dict[str, object]:
    argv = [sys.executable, str(SCRIPT), "--checkpoint-dir", "{checkpoint_dir}"]
    argv += ["--resume", "{resume_from}", "--steps", "{steps}", "--step-s", "0.05"]
    return {
        "argv": argv,
        "env": {"OMP_NUM_THREADS": "1"},
        "checkpoint_glob": "ckpt-*",
        "complete_marker": ".metadata",
        "progress_regex": r"step (?P<step>\d+) loss (?P<loss>[0-9.]+)",
        "params_regex": r"^params sha256 (?P<sha256>[0-9a-f]{64})$",
    }


@pytest.mark.long  # the suite fails a job of folder checkpoints over to its folder replica bit-exact (the Hugging Face Trainer's checkpoint-N/, tests/console/test_frameworks.py) and resumes this DCP script from its folder (tests/executors/test_command_folders.py)
async def test_a_dcp_job_fails_over_to_its_folder_replica_bit_exact(tmp_path: Path) -> None:
    fleet = write_inventory(
        tmp_path / "inventory.toml",
        hosts={"a": local_host(tmp_path / "a"), "b": local_host(tmp_path / "b", role="spare")},
        jobs={
            "p": {
                "host": "a",
                "spares": ["b"],
                "executor": "command",
                "steps": STEPS,
                "keep_checkpoints": 5,
                "command": command(),
            }
        },
    )
    argv = [sys.executable, str(SCRIPT), "--checkpoint-dir", str(tmp_path / "ref")]
    reference = asyncio.create_task(
        asyncio.to_thread(
            subprocess.run,
            [*argv, "--steps", str(STEPS)],
            capture_output=True,
            text=True,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
            timeout=120,
        )
    )
    ctl = Controller(load(fleet), Policy.AUTO)
    sup = ctl.jobs["p"]
    task = asyncio.create_task(ctl.run())
    await until(
        lambda: task.done() or (sup.step >= 25 and ctl.replicator.replica("p", "b").manifest),
        90,
        "step 25 and a replica on b",
    )
    assert not task.done(), task
    replica = ctl.replicator.replica("p", "b").manifest
    assert replica is not None and replica.files is not None
    name = f"step-{replica.step:010d}"
    on_b = tmp_path / "b" / "replicas" / "p" / f"{name}.pt"
    on_a = tmp_path / "a" / "jobs" / "p" / "checkpoints" / f"{name}.pt"
    assert on_b.is_dir() and tree(on_b) == tree(on_a), "the replica is the folder, byte for byte"
    assert {f.path for f in replica.files} == set(tree(on_b)) >= {".metadata", "__0_0.distcp"}
    placed = msgspec.json.decode(on_b.with_suffix(".json").read_bytes(), type=CheckpointManifest)
    assert placed == replica, "its manifest is in place"

    ctl.kill_host("a")
    await asyncio.wait_for(task, 120)
    await ctl.close()
    ref = await reference
    assert ref.returncode == 0, ref.stderr
    assert sup.state is JobState.FINISHED
    assert sup.host == "b"
    assert sup.sha256 == ref.stdout.strip().splitlines()[-1].split()[-1], (
        "the final parameters equal an uninterrupted run's"
    )
    (inc,) = incidents(list(read(fleet.parent / "state" / "journal.jsonl")))
    assert inc.fault_class == "host_lost"
    assert inc.resumed_step is not None and inc.resumed_step >= replica.step
