"""A multi-host job of the ``command`` kind under the console: a plain DDP script that knows
nothing of hotspare, launched by torchrun on each member with the rendezvous the console
hands out. Two members (plain DDP resumes bit-exact at two ranks; at more, the script's own
bucketed all-reduce sums in another order after a resume) and a spare, on local hosts."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import pytest
from support.fleetbed import EXECUTOR_ENV, local_host, until, write_inventory
from support.groupbed import executor_pid
from support.helpers import REPO

from console.controller import Controller
from console.inventory import load
from console.records.incidents import incidents
from console.records.journal import read
from console.states import JobState
from console.supervise.policy import Policy

SCRIPT = REPO / "tests" / "train_ddp_plain.py"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "{nnodes}"]
TORCHRUN += ["--node-rank", "{node_rank}", "--master-addr", "{master_addr}"]
TORCHRUN += ["--master-port", "{master_port}", "--nproc-per-node", "{local_world_size}"]
ARGS = ["--checkpoint-dir", "{checkpoint_dir}", "--resume", "{resume_from}", "--steps", "{steps}"]
ARGS += ["--backend", "{backend}", "--timeout-s", "{timeout_s}", "--save-every", "10"]
ARGS += ["--step-s", "0.05"]


def inventory(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return write_inventory(
        folder / "inventory.toml",
        hosts={
            "a": local_host(folder / "a"),
            "b": local_host(folder / "b"),
            "c": local_host(folder / "c", role="spare"),
        },
        jobs={
            "j": {
                "hosts": ["a", "b"],
                "spares": ["c"],
                "executor": "command",
                "steps": 80,
                "keep_checkpoints": 3,
                "command": {
                    "argv": [*TORCHRUN, str(SCRIPT), *ARGS],
                    "env": {"OMP_NUM_THREADS": "1"},
                    "checkpoint_glob": "ckpt-*.pt",
                    "complete_marker": "{name}.done",
                    "progress_regex": r"step (?P<step>\d+) loss (?P<loss>[0-9.]+)",
                    "params_regex": r"^params sha256 (?P<sha256>[0-9a-f]{64})$",
                    "grace_s": 2.0,
                },
            }
        },
    )


def controller(inv: Path) -> Controller:
    return Controller(load(inv), Policy.AUTO, executor_env={h: dict(EXECUTOR_ENV) for h in "abc"})


# the module-wide reference is made once, on the one worker that runs the whole module
pytestmark = pytest.mark.xdist_group(__name__)


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> str:
    inv = inventory(tmp_path_factory.mktemp("command-group"))

    async def go() -> str:
        ctl = controller(inv)
        await asyncio.wait_for(ctl.run(), 240)
        await ctl.close()
        sup = ctl.jobs["j"]
        assert sup.state is JobState.FINISHED, sup.live.why
        assert sup.sha256
        return sup.sha256

    return asyncio.run(go())


async def test_a_plain_ddp_script_under_torchrun_fails_over_bit_exact(
    tmp_path: Path, baseline: str
) -> None:
    inv = inventory(tmp_path)
    ctl = controller(inv)
    sup = ctl.jobs["j"]
    task = asyncio.create_task(ctl.run())
    await until(
        lambda: task.done() or (sup.rec.committed and ctl.replicator.replica("j", "c", 1).manifest),
        180,
        "a committed step and shard 1 on the spare",
    )
    assert not task.done()
    ctl.kill_host("b")
    await asyncio.wait_for(task, 240)
    await ctl.close()
    assert sup.state is JobState.FINISHED, sup.live.why
    assert sup.sha256 == baseline
    assert ctl.store.job("j").members == ["a", "c"]
    (inc,) = incidents(list(read(tmp_path / "state" / "journal.jsonl")))
    assert inc.fault_class == "host_lost"


@pytest.mark.long
async def test_a_killed_executor_restarts_the_group_in_place(tmp_path: Path, baseline: str) -> None:
    inv = inventory(tmp_path)
    ctl = controller(inv)
    sup = ctl.jobs["j"]
    task = asyncio.create_task(ctl.run())
    await until(lambda: task.done() or sup.rec.committed, 180, "a committed step")
    assert not task.done()
    os.kill(executor_pid(tmp_path / "a"), signal.SIGKILL)
    await asyncio.wait_for(task, 240)
    await ctl.close()
    assert sup.state is JobState.FINISHED, sup.live.why
    assert sup.sha256 == baseline
    assert ctl.store.job("j").members == ["a", "b"]
