"""Real frameworks' scripts, as their users write them, failed over by hotspare at its
defaults with only ``layout`` named: PyTorch Lightning (``ModelCheckpoint`` files
``epoch=E-step=S.ckpt``, ``fit(ckpt_path=...)``) and Hugging Face Transformers' ``Trainer``
on a tiny GPT-2 built locally (``checkpoint-N/`` folders, ``train(resume_from_checkpoint=...)``).

Host ``a`` is killed once a checkpoint has reached spare ``b``; the job must resume on ``b``
from that checkpoint (the first step after the kill is past it, never 1) and end with the
parameters of an uninterrupted run of the same script. The libraries are the real ones from
the package index (the ``test`` extra installs them).
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from chaos.observe import executor_events
from support.fleetbed import local_host, until, write_inventory
from support.helpers import REPO

from console.controller import Controller
from console.inventory import load
from console.records.incidents import incidents
from console.records.journal import read
from console.states import JobState
from console.supervise.policy import Policy

PARAMS = r"^params sha256 (?P<sha256>[0-9a-f]{64})$"
ENV = {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def reference(argv: list[str]) -> str:
    done = subprocess.run(
        argv, capture_output=True, text=True, env={**os.environ, **ENV}, timeout=300, check=True
    )
    return done.stdout.strip().splitlines()[-1].split()[-1]


async def fail_over(tmp_path: Path, command: dict[str, Any], steps: int, ref: list[str]) -> None:
    fleet = write_inventory(
        tmp_path / "inventory.toml",
        hosts={"a": local_host(tmp_path / "a"), "b": local_host(tmp_path / "b", role="spare")},
        jobs={
            "f": {
                "host": "a",
                "spares": ["b"],
                "executor": "command",
                "steps": steps,
                "keep_checkpoints": 2,
                "command": {"env": ENV, "params_regex": PARAMS, **command},
            }
        },
    )
    baseline = asyncio.create_task(asyncio.to_thread(reference, ref))
    ctl = Controller(load(fleet), Policy.AUTO)
    sup = ctl.jobs["f"]
    task = asyncio.create_task(ctl.run())
    await until(
        lambda: (
            task.done()
            or (
                (replica := ctl.replicator.replica("f", "b").manifest) is not None
                and replica.step > 0
            )
        ),
        180,
        "a checkpoint of the script on b",
    )
    assert not task.done(), task
    replica = ctl.replicator.replica("f", "b").manifest
    assert replica is not None
    ctl.kill_host("a")
    await asyncio.wait_for(task, 300)
    await ctl.close()
    assert sup.state is JobState.FINISHED and sup.host == "b", sup.live.why
    assert sup.sha256 == await baseline, "the final parameters equal an uninterrupted run's"
    steps_on_b = [
        int(m.group(1))
        for e in executor_events(tmp_path / "b" / "jobs" / "f")
        if (m := re.match(r"step (\d+)", str(e.get("text", ""))))
    ]
    assert steps_on_b and min(steps_on_b) > replica.step, (
        f"resumed past step {replica.step}, never from the start: first step on b "
        f"{min(steps_on_b, default=None)}"
    )
    (inc,) = incidents(list(read(fleet.parent / "state" / "journal.jsonl")))
    assert inc.fault_class == "host_lost" and inc.resumed_step is not None
    assert inc.resumed_step >= replica.step


@pytest.mark.long  # the suite runs the Hugging Face Trainer's failover (in this file) and nanoGPT's (test_byo_script)
async def test_a_lightning_script_fails_over_and_resumes_from_its_checkpoint(
    tmp_path: Path,
) -> None:
    pytest.importorskip("lightning")
    script = REPO / "tests" / "train_lightning.py"
    argv = [sys.executable, str(script), "--ckpt-dir", "{checkpoint_dir}"]
    command = {
        "argv": [*argv, "--ckpt-path", "{resume_from}", "--max-steps", "{steps}"],
        "layout": "lightning",
        "progress_regex": r"^step (?P<step>\d+) loss (?P<loss>[0-9.]+)$",
    }
    command["argv"] += ["--step-s", "0.05"]
    ref = [sys.executable, str(script), "--ckpt-dir", str(tmp_path / "ref"), "--max-steps", "96"]
    await fail_over(tmp_path, command, 96, ref)


async def test_a_hugging_face_trainer_fails_over_and_resumes_from_its_checkpoint(
    tmp_path: Path,
) -> None:
    pytest.importorskip("transformers")
    script = REPO / "tests" / "train_hf.py"
    argv = [sys.executable, str(script), "--output-dir", "{checkpoint_dir}"]
    command = {
        "argv": [*argv, "--resume", "{resume_from}", "--max-steps", "{steps}", "--step-s", "0.05"],
        "layout": "hf_trainer",
        "progress_regex": r"^step (?P<step>\d+)$",
    }
    ref = [sys.executable, str(script), "--output-dir", str(tmp_path / "ref"), "--max-steps", "80"]
    await fail_over(tmp_path, command, 80, ref)
