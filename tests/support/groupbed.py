"""Multi-host jobs in tests: a three-member job with one spare, and the parameters of its
uninterrupted run (cached per spec), against which every interrupted run is checked."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from typing import Any

import msgspec

from console.controller import Controller
from console.inventory import load
from console.states import JobState
from console.supervise.policy import Policy
from protocol.spec import CheckpointManifest
from support.fleetbed import EXECUTOR_ENV, job_table, local_host, write_inventory
from support.once import once

GROUP_CONFIG = {"global_batch": 6, "micro_batch": 2}
MEMBERS = ["a", "b", "c"]


def group_job(**over: Any) -> dict[str, Any]:
    """A job for hosts a, b, c with spare d (three ranks: the global batch divides by three)."""
    table = job_table(**{"steps": 240, **over})
    table["config"] = {**table["config"], **GROUP_CONFIG}
    return {"hosts": list(MEMBERS), "spares": ["d"], **table}


def local_group(
    folder: Path,
    console: dict[str, Any] | None = None,
    spare: dict[str, Any] | None = None,
    **over: Any,
) -> Path:
    """Three members and a spare on local hosts; ``console``: settings of its own (a lease);
    ``spare``: the spare's host settings beyond these (its ``python``)."""
    folder.mkdir(parents=True, exist_ok=True)
    return write_inventory(
        folder / "inventory.toml",
        hosts={
            "a": local_host(folder / "a"),
            "b": local_host(folder / "b"),
            "c": local_host(folder / "c"),
            "d": local_host(folder / "d", role="spare", **(spare or {})),
        },
        jobs={"j": group_job(**over)},
        **(console or {}),
    )


def controller(
    inventory: Path, hosts: tuple[str, ...] = ("a", "b", "c", "d"), **env_over: str
) -> Controller:
    """``env_over``: the executors' environment beyond ``EXECUTOR_ENV`` (a slower pace)."""
    env = {h: {**EXECUTOR_ENV, **env_over} for h in hosts}
    return Controller(load(inventory), Policy.AUTO, executor_env=env)


def shards(root: Path, job: str = "j") -> list[CheckpointManifest]:
    folder = root / "jobs" / job / "checkpoints"
    return [
        msgspec.json.decode(p.read_bytes(), type=CheckpointManifest)
        for p in sorted(folder.glob("step-*.json"))
    ]


def executor_pid(root: Path, job: str = "j") -> int:
    """The pid of the job's executor on the host rooted at ``root`` (its workdir's pid file)."""
    return int((root / "jobs" / job / "executor.pid").read_text())


def group_baseline(**over: Any) -> str:
    """The uninterrupted three-host run of ``group_job(**over)`` on local hosts (once per spec
    and test run, whichever worker asks first: ``once``)."""

    def make() -> str:
        with tempfile.TemporaryDirectory(prefix="hotspare-group-") as tmp:
            return asyncio.run(_run(local_group(Path(tmp), **over)))

    return once(
        b"groupbed.baseline " + msgspec.json.encode(group_job(**over), order="sorted"), make
    )


async def _run(inventory: Path) -> str:
    ctl = controller(inventory)
    await asyncio.wait_for(ctl.run(), 240)
    await ctl.close()
    sup = ctl.jobs["j"]
    assert sup.state is JobState.FINISHED, sup.live.why
    assert sup.sha256
    return sup.sha256
