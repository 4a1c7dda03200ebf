"""Bring your own script: one checkpoint file rewritten in place, resumed by a flag (nanoGPT's
way: ``out/ckpt.pt``, ``--init_from=resume``), on local host ``a`` with spare ``b``.

Each complete write of the file is published under the step the script last printed, copied
to ``b``; ``a`` killed, the job resumes on ``b`` from that checkpoint (the script says from
which iteration, never 0) and ends with the parameters of an uninterrupted run. The run on
``b`` is forked from a zygote that started before ``a``'s lease ended (readied during the
lease wait, at the shipped defaults).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from chaos.observe import executor_events
from support.fleetbed import local_host, until, write_inventory
from support.helpers import REPO
from support.lease_bounds import LeaseBounds

from console.controller import Controller
from console.inventory import load
from console.records.incidents import incidents
from console.records.journal import read
from console.states import JobState
from console.supervise.lease import PERSIST_AHEAD
from console.supervise.policy import Policy
from executors.agent.workdir import COMMAND_GROUP

SCRIPT = REPO / "tests" / "train_nanogpt_style.py"
ITERS = 600
LEASE_S = 8.0


def command() -> dict[str, object]:
    return {
        "argv": [
            sys.executable,
            str(SCRIPT),
            "--out_dir={checkpoint_dir}",
            "--max_iters={steps}",
            "--eval_interval=40",
            "--iter_s=0.02",
        ],
        "layout": "nanogpt",  # checkpoint_file, resume_argv and progress_regex
        "env": {"OMP_NUM_THREADS": "1"},
        "settle_s": 0.3,
        "params_regex": r"^params sha256 (?P<sha256>[0-9a-f]{64})$",
    }


@dataclass(frozen=True)
class Forked:
    pid: int
    """The zygote the run was forked from."""
    started: float
    """When it started, CLOCK_BOOTTIME (the clock of the console's persisted lease bounds)."""


def forked_from(workdir: Path) -> Forked | None:
    """The zygote the command running in ``workdir`` was forked from, from /proc (the group the
    executor recorded, its leader's parent); None until there is one."""
    try:
        pgid = json.loads((workdir / COMMAND_GROUP).read_text())["pgid"]
        leader = Path(f"/proc/{pgid}/stat").read_text().rsplit(")", 1)[1].split()
        parent = int(leader[1])
        if Path(f"/proc/{parent}/cmdline").read_bytes().split(b"\0")[0] != b"hotspare-zygote":
            return None
        fields = Path(f"/proc/{parent}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, ValueError, KeyError):
        return None
    return Forked(parent, int(fields[19]) / os.sysconf("SC_CLK_TCK"))


async def test_a_file_rewritten_in_place_is_checkpointed_and_resumed_by_its_flag(
    tmp_path: Path,
) -> None:
    fleet = write_inventory(
        tmp_path / "inventory.toml",
        hosts={"a": local_host(tmp_path / "a"), "b": local_host(tmp_path / "b", role="spare")},
        jobs={
            "n": {
                "host": "a",
                "spares": ["b"],
                "executor": "command",
                "steps": ITERS,
                "keep_checkpoints": 3,
                "command": command(),
            }
        },
        lease_s=LEASE_S,  # room to see the target readied inside the lease wait
    )
    reference = asyncio.create_task(
        asyncio.to_thread(
            subprocess.run,
            [sys.executable, str(SCRIPT), f"--out_dir={tmp_path / 'ref'}", f"--max_iters={ITERS}"],
            capture_output=True,
            text=True,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
            timeout=300,
        )
    )
    ctl = Controller(load(fleet), Policy.AUTO)
    sup = ctl.jobs["n"]
    task = asyncio.create_task(ctl.run())
    await until(
        lambda: task.done() or (sup.step >= 200 and ctl.replicator.replica("n", "b").manifest),
        120,
        "step 200 and a replica of ckpt.pt on b",
    )
    assert not task.done(), task
    replica = ctl.replicator.replica("n", "b").manifest
    assert replica is not None and replica.source == "ckpt.pt" and replica.step > 0
    # published under the step printed before the write: a multiple of 40, less one
    assert (replica.step + 1) % 40 == 0, replica.step

    lost_epoch = sup.epoch
    with LeaseBounds(fleet.parent / "state" / "state.json") as bounds:
        await until(lambda: ("n", "a", lost_epoch) in bounds.until, 10, "a's lease bound read")
        ctl.kill_host("a")
        zygote = await until(
            lambda: task.done() or forked_from(tmp_path / "b" / "jobs" / "n"),
            120,
            "the run on b, forked from its zygote",
        )
        # the newest lease a held ended no earlier than its persisted bound less the lead
        bound = bounds.until[("n", "a", lost_epoch)] - LEASE_S * PERSIST_AHEAD
    assert not isinstance(zygote, bool), task
    assert zygote.started < bound, (
        f"b's zygote started {zygote.started - bound:.2f}s after a's lease could have ended: "
        "not readied during the lease wait"
    )
    await asyncio.wait_for(task, 240)
    await ctl.close()
    ref = await reference
    assert ref.returncode == 0, ref.stderr
    assert sup.state is JobState.FINISHED and sup.host == "b"
    assert sup.sha256 == ref.stdout.strip().splitlines()[-1].split()[-1], (
        "the final parameters equal an uninterrupted run's"
    )
    said = [
        str(e.get("text"))
        for e in executor_events(tmp_path / "b" / "jobs" / "n")
        if "resuming from iter" in str(e.get("text", ""))
    ]
    assert said, "the script was resumed by its flag"
    resumed_at = int(said[0].split()[-1])
    assert resumed_at >= replica.step + 1 > 0, (resumed_at, replica.step)
    (inc,) = incidents(list(read(fleet.parent / "state" / "journal.jsonl")))
    assert inc.fault_class == "host_lost" and inc.resumed_step is not None
    assert inc.resumed_step >= replica.step


async def test_the_file_configured_the_numbered_way_is_a_warning_in_the_journal(
    tmp_path: Path,
) -> None:
    """nanoGPT's ckpt.pt under the default checkpoint_glob: once a silent zero (no checkpoint,
    a failover restarted from 0); now a journal warning that names the file and the fix."""
    cmd = command()
    del cmd["layout"]
    cmd["progress_regex"] = r"^iter (?P<step>\d+): loss (?P<loss>[0-9.]+)$"
    fleet = write_inventory(
        tmp_path / "inventory.toml",
        hosts={"a": local_host(tmp_path / "a")},
        jobs={"n": {"host": "a", "executor": "command", "steps": 100_000, "command": cmd}},
    )
    ctl = Controller(load(fleet), Policy.AUTO)
    task = asyncio.create_task(ctl.run())
    journal = fleet.parent / "state" / "journal.jsonl"
    try:
        warned = await until(
            lambda: [e for e in read(journal) if e.kind.value == "warning"],
            120,
            "the warning in the journal",
        )
    finally:
        ctl.stop_job("n")
        await asyncio.wait_for(task, 60)
        await ctl.close()
    assert len(warned) == 1, [e.msg for e in warned]
    assert "ckpt.pt" in warned[0].msg and "checkpoint_file = 'ckpt.pt'" in warned[0].msg
    assert warned[0].job == "n" and warned[0].host == "a"
