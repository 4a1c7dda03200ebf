"""An operator's stop that comes while the job is being launched (deploying: its executor is
starting, not linked yet) stops the job: the executor that comes up is not Started.

Found by the loaded suite run at 5984728 (test_stop_is_not_failure): a lease lapsed under load,
the job was restarted in place, and 's' came during that restart's deploy. The console said
"no executor to tell; it stops before anything is started again", then Started the executor
it had been starting, and the job trained on to its end: the stop was honoured only before the
next launch, not within the one under way.

The executor is made slow to start as a fresh host's deploy or a loaded machine would be:
its interpreter sleeps before serving. Evidence: the executor's own events (no step trained
after the stop) and the state file, not the console's account.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest
from support.fleetbed import EXECUTOR_ENV, local_host, stdlib_job, until, write_inventory
from support.groupbed import controller as group_controller
from support.groupbed import local_group

from console.controller import Controller
from console.inventory import load
from console.states import JobState
from console.supervise.policy import Policy

SLOW_S = 4


def slow_python(folder: Path) -> Path:
    """An interpreter that sleeps before an executor serves."""
    slow = folder / "slow-python"
    slow.write_text(
        f'#!/bin/sh\ncase "$*" in *"executors.cli serve"*) sleep {SLOW_S};; esac\n'
        f'exec {sys.executable} "$@"\n'
    )
    slow.chmod(0o755)
    return slow


def trained(root: Path) -> list[str]:
    events = root / "jobs" / "j" / "events.jsonl"
    if not events.exists():
        return []
    kinds = (json.loads(line).get("kind") for line in events.read_text().splitlines() if line)
    return [k for k in kinds if k in ("progress", "resumed", "checkpoint", "finished")]


async def stop_while_deploying(ctl: Controller, roots: list[Path]) -> None:
    sup = ctl.jobs["j"]
    task = asyncio.create_task(ctl.run())
    try:
        await until(lambda: sup.state is JobState.DEPLOYING, 60, "the job deploying")
        assert sup.link is None, "no executor linked yet: the stop cannot be told to one"
        ctl.jobs["j"].request_stop()
        await asyncio.wait_for(task, 120)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await ctl.close()
    assert sup.state is JobState.STOPPED, (sup.state, sup.live.why)
    assert ctl.store.job("j").stopped, "recorded as an operator's stop"
    for root in roots:
        assert trained(root) == [], f"{root.name} trained after the stop"


async def test_a_stop_while_the_job_deploys_starts_nothing(tmp_path: Path) -> None:
    slow = slow_python(tmp_path)
    inventory = write_inventory(
        tmp_path / "inventory.toml",
        hosts={
            "a": local_host(tmp_path / "a", python=str(slow)),
            "b": local_host(tmp_path / "b", role="spare"),
        },
        jobs={"j": {"host": "a", "spares": ["b"], **stdlib_job(steps=5000)}},
    )
    env = {h: dict(EXECUTOR_ENV) for h in "ab"}
    ctl = Controller(load(inventory), Policy.AUTO, executor_env=env)
    await stop_while_deploying(ctl, [tmp_path / "a"])


@pytest.mark.long  # the suite proves it for one host (in this file)
async def test_a_stop_while_a_group_deploys_starts_no_member(tmp_path: Path) -> None:
    inv = local_group(tmp_path, steps=5000)
    slow = slow_python(tmp_path)
    c_root = str(tmp_path / "c")
    text = inv.read_text()
    assert text.count(f'root = "{c_root}"') == 1
    inv.write_text(text.replace(f'root = "{c_root}"', f'root = "{c_root}"\npython = "{slow}"'))
    await stop_while_deploying(group_controller(inv), [tmp_path / h for h in "abc"])
