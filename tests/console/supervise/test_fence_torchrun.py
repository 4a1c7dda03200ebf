"""No process of an old epoch outlives its lease, under a real launcher.

A single-host ``command`` job runs ``torchrun --standalone --nproc-per-node 2`` over a DDP
script that logs only to a file (no EPIPE ever ends a worker whose executor is gone), with
``restart_limit = 0``. The executor on ``a`` is SIGKILLed: torchrun's workers start their own
session, so nothing but the run's fence ends them. The job fails over to ``b`` at epoch 2 and
ends with the uninterrupted run's parameters.

Evidence: /proc (every process of the job by the epoch in its environment, sampled from before
the kill to the end: no sample holds an epoch-1 process once an epoch-2 process exists), and
the final checkpoint's bytes, hashed here.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
import sys
from pathlib import Path

import pytest
import torch
from chaos.epochs import EpochSampler, run_processes
from support.fleetbed import EXECUTOR_ENV, local_host, until, write_inventory
from support.helpers import REPO, alive

from console.controller import Controller
from console.inventory import load
from console.states import JobState
from console.supervise.policy import Policy

SCRIPT = REPO / "tests" / "train_ddp_plain.py"
STEPS = 160
ARGV = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
ARGV += [str(SCRIPT), "--checkpoint-dir", "{checkpoint_dir}", "--resume", "{resume_from}"]
ARGV += ["--steps", "{steps}", "--save-every", "10", "--step-s", "0.05"]
ARGV += ["--metrics-file", "metrics.jsonl"]


def inventory(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return write_inventory(
        folder / "inventory.toml",
        hosts={"a": local_host(folder / "a"), "b": local_host(folder / "b", role="spare")},
        jobs={
            "t": {
                "host": "a",
                "spares": ["b"],
                "executor": "command",
                "steps": STEPS,
                "keep_checkpoints": 3,
                "command": {
                    "argv": ARGV,
                    "env": {"OMP_NUM_THREADS": "1"},
                    "checkpoint_glob": "ckpt-*.pt",
                    "complete_marker": "{name}.done",
                    "metrics_file": "metrics.jsonl",
                    "grace_s": 2.0,
                },
            }
        },
        restart_limit=0,
    )


MARK = "HOTSPARE_TEST_FOLDER"
"""Every process of a test's run carries its folder in the environment: the /proc evidence
is of this test's run alone (the baseline fixture runs a job t too, on another worker)."""


def controller(inv: Path) -> Controller:
    env = {**EXECUTOR_ENV, MARK: str(inv.parent)}
    return Controller(load(inv), Policy.AUTO, executor_env={h: dict(env) for h in "ab"})


def mark(folder: Path) -> bytes:
    return f"{MARK}={folder}".encode()


def final_params(root: Path) -> str:
    """sha256 over the final checkpoint's model tensors, as loaded here."""
    ck = torch.load(root / "jobs" / "t" / "ckpt" / f"ckpt-{STEPS}.pt", weights_only=True)
    h = hashlib.sha256()
    for name, t in ck["model"].items():
        h.update(name.encode())
        h.update(t.contiguous().numpy().tobytes())
    return h.hexdigest()


# the module-wide reference is made once, on the one worker that runs the whole module
pytestmark = pytest.mark.xdist_group(__name__)


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> str:
    folder = tmp_path_factory.mktemp("torchrun-baseline")
    inv = inventory(folder)

    async def go() -> None:
        ctl = controller(inv)
        await asyncio.wait_for(ctl.run(), 240)
        await ctl.close()
        assert ctl.jobs["t"].state is JobState.FINISHED, ctl.jobs["t"].live.why

    asyncio.run(go())
    return final_params(folder / "a")


@pytest.mark.long  # the suite's fence ends a SIGKILLed executor's workers in a session of their own at once (tests/executors/test_fence.py, test_command_reap.py); torchrun's group fails over bit-exact under the console (test_group_command)
async def test_a_sigkilled_executors_torchrun_workers_never_train_beside_the_next_epoch(
    tmp_path: Path, baseline: str
) -> None:
    inv = inventory(tmp_path)
    ctl = controller(inv)
    sup = ctl.jobs["t"]
    with EpochSampler(jobs={"t"}, mark=mark(tmp_path)) as sampler:
        task = asyncio.create_task(ctl.run())
        await until(
            lambda: (
                task.done()
                or (
                    ctl.replicator.replica("t", "b").manifest
                    and len(sampler.seen.get(("t", 1), ())) >= 3
                )
            ),
            180,
            "a replica on b and torchrun's agent and both workers in /proc",
        )
        assert not task.done()
        workers = set(sampler.seen[("t", 1)])
        os.kill(int((tmp_path / "a" / "jobs" / "t" / "executor.pid").read_text()), signal.SIGKILL)
        await asyncio.wait_for(task, 240)
        await ctl.close()
    assert sup.state is JobState.FINISHED, sup.live.why
    assert ctl.store.job("t").host == "b"
    assert ("t", 2) in sampler.first, "the sampler saw epoch 2's processes"
    assert len(workers) >= 3, f"the sampler saw torchrun and its workers at epoch 1: {workers}"
    assert sampler.stale == [], f"epoch-1 processes beside epoch 2: {sampler.stale[:3]}"
    assert final_params(tmp_path / "b") == baseline


@pytest.mark.long  # the suite's fence ends every process of a run once its executor is gone (tests/executors/test_fence.py, test_command_reap.py)
async def test_a_killed_local_host_leaves_nothing_of_the_run_alive(
    tmp_path: Path, baseline: str
) -> None:
    inv = inventory(tmp_path)
    ctl = controller(inv)
    sup = ctl.jobs["t"]
    task = asyncio.create_task(ctl.run())
    await until(
        lambda: (
            task.done()
            or (
                ctl.replicator.replica("t", "b").manifest
                and len(run_processes_of("t", tmp_path)) >= 3
            )
        ),
        180,
        "a replica on b and torchrun's agent and both workers in /proc",
    )
    assert not task.done()
    root = str(tmp_path / "a")
    before = {p for p in host_processes(root)}
    assert before, "the sampler sees the host's processes"
    ctl.kill_host("a")
    left = [p for p in before if alive(p)]
    assert left == [], f"alive after the host's power cut: {left}"
    assert run_processes_of("t", tmp_path) == {}, "no process of the run, whatever its session"
    await asyncio.wait_for(task, 240)
    await ctl.close()
    assert sup.state is JobState.FINISHED, sup.live.why
    assert final_params(tmp_path / "b") == baseline


def run_processes_of(job: str, folder: Path) -> dict[int, tuple[str, int]]:
    return {pid: je for pid, je in run_processes(mark(folder)).items() if je[0] == job}


def host_processes(root: str) -> list[int]:
    """Every live process whose working directory is under the host's folder (/proc)."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                cwd = os.readlink(f"/proc/{name}/cwd")
            except OSError:
                continue
            if (cwd == root or cwd.startswith(root + "/")) and alive(int(name)):
                found.append(int(name))
    return found
