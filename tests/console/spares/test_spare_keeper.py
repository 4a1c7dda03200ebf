"""A spare that becomes unfit while its job trains is replaced, and the newest checkpoint is
sent to the new one, so a failover finds a replica where it goes (not a start from step 0).

Evidence: the replica files on the new spare's disk (their bytes against the manifest's
sha256), the journal, and the step the job resumed at after its host was killed.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path

from support.fleetbed import EXECUTOR_ENV, job_table, local_host, until, write_inventory

from console.controller import Controller
from console.inventory import load
from console.records.journal import Event, Kind
from console.spares.spare_keeper import GRACE_S, SpareKeeper
from console.states import HostState, JobState
from console.supervise.policy import Policy


def verified_replicas(root: Path, job: str) -> list[int]:
    """Steps of the replicas on a host's disk whose bytes match their manifest."""
    steps = []
    for manifest in sorted((root / "replicas" / job).glob("step-*.json")):
        m = json.loads(manifest.read_text())
        data = manifest.with_suffix(".pt")
        if data.exists() and hashlib.sha256(data.read_bytes()).hexdigest() == m["sha256"]:
            steps.append(m["step"])
    return steps


async def test_an_unfit_spare_is_replaced_and_the_new_one_holds_a_replica_for_the_failover(
    tmp_path: Path,
) -> None:
    inventory = write_inventory(
        tmp_path / "inventory.toml",
        hosts={
            "a": local_host(tmp_path / "a"),
            "b": local_host(tmp_path / "b", role="spare"),
            "c": local_host(tmp_path / "c", role="spare"),
        },
        jobs={"j": {"host": "a", "spares": ["b"], **job_table(steps=100_000)}},
    )
    env = {h: dict(EXECUTOR_ENV) for h in ("a", "b", "c")}
    ctl = Controller(load(inventory), Policy.AUTO, executor_env=env)
    sup = ctl.jobs["j"]
    events: list[Event] = []
    ctl.journal.subscribe(events.append)
    task = asyncio.create_task(ctl.run())
    try:
        await until(
            lambda: (
                (sup.state is JobState.RUNNING and verified_replicas(tmp_path / "b", "j"))
                or task.done()
            ),
            90,
            "a replica on b",
        )
        assert not task.done(), task
        assert sup.spares == ["b"] and not verified_replicas(tmp_path / "c", "j")
        ctl.cordon("b")  # b can no longer take the job
        await until(lambda: sup.spares == ["c"] or task.done(), 30, "b replaced by c")
        replaced = [e for e in events if e.kind is Kind.PLACEMENT and "replaced by c" in e.msg]
        assert replaced and "spare b is unfit (cordoned)" in replaced[0].msg, replaced
        assert replaced[0].data["change"] == "spare", "a reader can tell it from a placement"
        # c was there to replace b all along: no alert that the job has no healthy spare
        assert not [e for e in events if e.kind is Kind.ALERT and "healthy spare" in e.msg]
        await until(
            lambda: verified_replicas(tmp_path / "c", "j") or task.done(), 30, "a replica on c"
        )
        on_c = max(verified_replicas(tmp_path / "c", "j"))
        assert on_c > 0
        ctl.kill_host("a")
        await until(
            lambda: (sup.host == "c" and sup.resumed_step is not None) or task.done(),
            60,
            "j resumed on c",
        )
        assert not task.done(), task
        assert sup.resumed_step is not None and sup.resumed_step >= on_c, sup.resumed_step
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await ctl.close()


def test_a_spare_down_for_one_probe_is_kept_and_one_down_past_the_grace_is_replaced(
    tmp_path: Path,
) -> None:
    """A flap (one failed reachability probe) must not move a job's replicas elsewhere."""
    inventory = write_inventory(
        tmp_path / "inventory.toml",
        hosts={
            "a": local_host(tmp_path / "a"),
            "b": local_host(tmp_path / "b", role="spare"),
            "c": local_host(tmp_path / "c", role="spare"),
        },
        jobs={"j": {"host": "a", "spares": ["b"], **job_table()}},
    )
    ctl = Controller(load(inventory), Policy.AUTO)
    sup = ctl.jobs["j"]
    sup.host, sup.spares = "a", ["b"]
    ctl.fleet.hosts["a"].job = "j"
    sup.live.machine.move(JobState.DEPLOYING)
    sup.live.machine.move(JobState.RUNNING)
    keeper = SpareKeeper(
        sup.live,
        inv=ctl.inv,
        fleet=ctl.fleet,
        journal=ctl.journal,
        replicator=ctl.replicator,
        reserved=dict,
        priorities=ctl.priorities,
        save=ctl.store.save,
    )
    t = 1000.0
    ctl.fleet.set_state("b", HostState.DOWN, "unreachable")
    assert keeper.check(t) == {} and keeper.check(t + GRACE_S - 0.1) == {}
    ctl.fleet.set_state("b", HostState.UP, "reachable again")
    assert keeper.check(t + GRACE_S + 1) == {} and sup.spares == ["b"]
    ctl.fleet.set_state("b", HostState.DOWN, "unreachable")
    assert keeper.check(t + 10) == {}, "the grace starts again at the new fall"
    assert keeper.check(t + 10 + GRACE_S) == {"b": "c"}
    assert sup.spares == ["c"] and sup.rec.spares == ["c"]


async def test_a_job_with_no_spare_takes_a_host_added_later_and_fails_over_there(
    tmp_path: Path,
) -> None:
    """Placed with no spare (none usable), the job takes the first host that appears as its
    spare and sends it the newest checkpoint: the failover then resumes from a replica, not
    from step 0 (a host added, or one the provisioner made, used to sit unused)."""
    inventory = write_inventory(
        tmp_path / "inventory.toml",
        hosts={"a": local_host(tmp_path / "a")},
        jobs={"j": {"host": "a", **job_table(steps=100_000)}},
    )
    env = {h: dict(EXECUTOR_ENV) for h in ("a", "c")}
    ctl = Controller(load(inventory), Policy.AUTO, executor_env=env)
    sup = ctl.jobs["j"]
    task = asyncio.create_task(ctl.run())
    try:
        await until(lambda: sup.step >= 40 or task.done(), 90, "j training on a")
        assert sup.spares == []
        ctl.add_host("c", local_host(tmp_path / "c"))
        await until(lambda: sup.spares == ["c"] or task.done(), 30, "c taken as the spare")
        await until(
            lambda: verified_replicas(tmp_path / "c", "j") or task.done(), 30, "a replica on c"
        )
        on_c = max(verified_replicas(tmp_path / "c", "j"))
        ctl.kill_host("a")
        await until(
            lambda: (sup.host == "c" and sup.resumed_step is not None) or task.done(),
            60,
            "j resumed on c",
        )
        assert not task.done(), task
        assert sup.resumed_step >= on_c > 0
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await ctl.close()
