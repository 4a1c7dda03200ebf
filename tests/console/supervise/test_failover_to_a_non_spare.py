"""A job on one host whose failover goes to a host that was no spare (its spare cordoned,
still up): the newest checkpoint the spare holds is copied to that host before the job
starts there, so it resumes from it, not from step 0 (``Targets.ensure_replica``, given by
the one supervisor to its resume step; a group of one lacked it when the two supervisors
became one). Real executors, a real kill; evidence: c's own events and the files on c."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from support.fleetbed import EXECUTOR_ENV, local_host, stdlib_job, until, write_inventory

from console.controller import Controller
from console.inventory import load
from console.records.incidents import incidents
from console.records.journal import read
from console.supervise.policy import Policy


async def test_a_failover_to_a_host_that_was_no_spare_resumes_from_the_spares_replica(
    tmp_path: Path,
) -> None:
    inv = write_inventory(
        tmp_path / "inventory.toml",
        hosts={
            "a": local_host(tmp_path / "a"),
            "b": local_host(tmp_path / "b", role="spare"),
            "c": local_host(tmp_path / "c"),
        },
        jobs={"j": {"host": "a", "spares": ["b"], "warm_standby": False, **stdlib_job(steps=400)}},
    )
    ctl = Controller(load(inv), Policy.AUTO, executor_env={h: dict(EXECUTOR_ENV) for h in "abc"})
    sup = ctl.jobs["j"]
    task = asyncio.create_task(ctl.run())
    try:
        await until(
            lambda: (
                ((st := ctl.replicator.replica("j", "b").manifest) is not None and st.step >= 40)
                or task.done()
            ),
            120,
            "a replica of step 40 on b",
        )
        assert not task.done(), task
        ctl.cordon("b")  # up and reachable, but no place for the job
        held = ctl.replicator.replica("j", "b").manifest
        assert held is not None
        ctl.kill_host("a")
        await asyncio.wait_for(task, 180)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await ctl.close()
    assert sup.host == "c" and sup.state.value == "finished", sup.live.why
    resumed = [
        json.loads(line)
        for line in (tmp_path / "c" / "jobs" / "j" / "events.jsonl").read_text().splitlines()
        if '"kind":"resumed"' in line
    ]
    assert resumed and resumed[0]["step"] >= held.step, (resumed, held.step)
    (inc,) = incidents(read(tmp_path / "state" / "journal.jsonl"))
    assert inc.fault_class == "host_lost" and inc.resumed_step == resumed[0]["step"]
