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

import pytest
from support.fleetbed import EXECUTOR_ENV, job_table, local_host, stdlib_job, until, write_inventory
from support.manifests import manifest, saved

from console.controller import Controller
from console.inventory import load
from console.records.journal import Event, Kind
from console.spares.spare_keeper import GRACE_S, SpareKeeper
from console.states import HostState, JobState
from console.supervise.policy import Policy


def verified_replicas(root: Path, job: str) -> list[int]:
    """Steps of the replicas on a host's disk whose bytes match their manifest."""
    return verified_in(root / "replicas" / job)


def verified_in(folder: Path) -> list[int]:
    """Steps of the replicas in ``folder`` whose bytes match their manifest."""
    steps = []
    for path in sorted(folder.glob("step-*.json")):
        m = json.loads(path.read_text())
        data = folder / m["file"]  # the checkpoint's own name: step-N.pt, or a script's
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
        jobs={"j": {"host": "a", "spares": ["b"], **stdlib_job(steps=100_000)}},
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


@pytest.mark.parametrize("kind", ["one host", "group"])
def test_a_spare_down_for_one_probe_is_kept_and_one_down_past_the_grace_is_replaced(
    tmp_path: Path, kind: str
) -> None:
    """A flap (one failed reachability probe) must not move a job's replicas elsewhere. The
    same keeper for a group (its spares were never replaced): no member is chosen as a spare,
    and every member's newest shard goes to the new one."""
    members = ["a"] if kind == "one host" else ["a", "d"]
    inventory = write_inventory(
        tmp_path / "inventory.toml",
        hosts={
            "a": local_host(tmp_path / "a"),
            "b": local_host(tmp_path / "b", role="spare"),
            "c": local_host(tmp_path / "c", role="spare"),
            "d": local_host(tmp_path / "d"),
        },
        jobs={"j": {"host": "a", "spares": ["b"], **job_table()}},
    )
    ctl = Controller(load(inventory), Policy.AUTO)
    sup = ctl.jobs["j"]
    sup.host, sup.spares = "a", ["b"]
    for h in "abcd":
        ctl.fleet.set_state(h, HostState.UP, "test")
    for h in members:
        ctl.fleet.hosts[h].job = "j"
    sup.live.machine.move(JobState.DEPLOYING)
    sup.live.machine.move(JobState.RUNNING)
    sent: list[list[str]] = []
    keeper = SpareKeeper(
        sup.live,
        inv=ctl.inv,
        fleet=ctl.fleet,
        journal=ctl.journal,
        hosts=lambda: members,
        send_newest=sent.append,
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
    ctl.fleet.hosts["d"].job = "j" if kind == "group" else None
    got = keeper.check(t + 10 + GRACE_S)
    assert got == {"b": "c"}, "c, not the member d (d is free for a single host's job)" + str(got)
    assert sup.spares == ["c"] and sup.rec.spares == ["c"]
    assert sent == [["c"]]


def test_a_group_sends_every_members_newest_shard_of_its_epoch_to_a_new_spare(
    tmp_path: Path,
) -> None:
    from support.jobbed import Calls, services

    from console.replication.replicator import Source
    from console.supervise.member import Member
    from console.supervise.supervisor import Supervisor

    svc = services(tmp_path, Calls())
    group = Supervisor(svc, "g")
    submitted: list[tuple[list[str], Source]] = []
    svc.replicator.submit = lambda job, spares, src: submitted.append((list(spares), src))  # type: ignore[method-assign]
    group.live.rec.epoch = 2
    group._messages.new_epoch(["a", "b"])
    group.commits.new_epoch(2, 2)

    def report(rank: int, host: str, step: int, epoch: int = 2) -> None:
        msg = saved(manifest(step, job="g", epoch=epoch, node_rank=rank, nnodes=2))
        group._messages.on_message(Member(rank, host), msg)

    report(0, "a", 20)
    report(1, "b", 20)
    report(0, "a", 40)
    report(1, "b", 10, epoch=1)  # an older epoch's report: not this epoch's shard
    submitted.clear()
    group._messages.send_newest(["c"])
    assert sorted((s, src.host, src.manifest.step, src.shard) for s, src in submitted) == [
        (["c"], "a", 40, 0),
        (["c"], "b", 20, 1),
    ]
    group._messages.new_epoch(["a", "b"])
    submitted.clear()
    group._messages.send_newest(["c"])
    assert submitted == [], "a new epoch's spares get its own shards, none of the last one's"


def test_after_a_failover_a_new_spare_gets_the_checkpoint_the_new_host_resumed_from(
    tmp_path: Path,
) -> None:
    """A single host's job failed over from a to b and resumed there at step 20: a spare
    taken now gets step 20 from b's own checkpoints (one path with a group's: each executor's
    newest). It was sent from b at the path a wrote it at (another root: no such file on b),
    and from a, the host left, before b said where it resumed."""
    from support.jobbed import Calls, services

    from console.reach.deploy import checkpoint_file
    from console.replication.replicator import Source
    from console.supervise.member import Member
    from console.supervise.supervisor import Supervisor
    from protocol.messages import Resumed

    svc = services(tmp_path, Calls())
    one = Supervisor(svc, "j")  # a job on one host: a group of one
    submitted: list[tuple[list[str], Source]] = []
    svc.replicator.submit = lambda job, spares, src: submitted.append((list(spares), src))  # type: ignore[method-assign]
    one.live.host, one.live.rec.epoch = "a", 1
    one._messages.new_epoch(["a"])
    one.commits.new_epoch(1, 1)  # as an epoch's start does
    one._messages.on_message(Member(0, "a"), saved(manifest(20, job="j", epoch=1)))
    one.live.host, one.live.rec.epoch = "b", 2  # failed over: b's executor, epoch 2
    one._messages.new_epoch(["b"])
    submitted.clear()
    one._keeper._send_newest(["c"])
    assert submitted == [], "nothing from a, the host the job left, or from b before it resumed"
    resumed = Resumed(step=20, checkpoint="step-00000020.pt", epoch=2, load_s=0.1)
    one._messages.on_message(Member(0, "b"), resumed)
    one._keeper._send_newest(["c"])
    ((spares, src),) = submitted
    on_b = checkpoint_file(svc.inv.host_root("b"), "j", 20)
    assert (spares, src.host, src.path, src.manifest.step) == (["c"], "b", on_b, 20)
    assert on_b != checkpoint_file(svc.inv.host_root("a"), "j", 20), "the roots differ"
    assert one.live.checkpoint_path == on_b, "a failover's copy is taken from there too"


async def test_a_job_with_no_spare_takes_a_host_added_later_and_fails_over_there(
    tmp_path: Path,
) -> None:
    """Placed with no spare (none usable), the job takes the first host that appears as its
    spare and sends it the newest checkpoint: the failover then resumes from a replica, not
    from step 0 (a host added, or one the provisioner made, used to sit unused)."""
    inventory = write_inventory(
        tmp_path / "inventory.toml",
        hosts={"a": local_host(tmp_path / "a")},
        jobs={"j": {"host": "a", **stdlib_job(steps=100_000)}},
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


@pytest.mark.long  # the suite proves it for one host (in this file); the group's choice is test_services' decision test
async def test_a_groups_unfit_spare_is_replaced_and_a_member_lost_later_resumes_there(
    tmp_path: Path,
) -> None:
    """A three-member group's spare d is cordoned while it trains: e replaces it and receives
    every member's shard (on e's disk, checked against their manifests); c's host is then
    killed and its rank resumes on e from a step e held a replica of. Before, a group's
    spares were never kept. (That a member's replacement ends bit-exact is test_group_local's.)"""
    from chaos.observe import executor_events
    from support.groupbed import controller, group_job

    inventory = write_inventory(
        tmp_path / "inventory.toml",
        hosts={
            **{h: local_host(tmp_path / h) for h in "abc"},
            "d": local_host(tmp_path / "d", role="spare"),
            "e": local_host(tmp_path / "e", role="spare"),
        },
        jobs={"j": group_job(steps=800)},
    )
    ctl = controller(inventory, hosts=("a", "b", "c", "d", "e"))
    sup = ctl.jobs["j"]
    task = asyncio.create_task(ctl.run())

    def shards_on(host: str) -> set[str]:
        """The members whose shard has a whole replica on ``host`` (bytes against manifest)."""
        return {
            node.name
            for node in (tmp_path / host / "replicas" / "j").glob("node-*")
            if verified_in(node)
        }

    try:
        await until(
            lambda: (sup.state is JobState.RUNNING and sup.step >= 40) or task.done(),
            120,
            "step 40",
        )
        assert sup.spares == ["d"] and not task.done(), task
        ctl.cordon("d")
        await until(lambda: sup.spares == ["e"] or task.done(), 30, "d replaced by e")
        await until(
            lambda: shards_on("e") == {"node-0", "node-1", "node-2"} or task.done(),
            60,
            "every member's shard on e",
        )
        assert not task.done() and sup.step < 700, "c is killed while the group trains"
        held = set(verified_in(tmp_path / "e" / "replicas" / "j" / "node-2"))
        ctl.kill_host("c")
        await asyncio.wait_for(task, 240)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await ctl.close()
    assert sup.state is JobState.FINISHED, sup.live.why
    assert ctl.store.job("j").members == ["a", "b", "e"], "e took c's rank"
    on_e = executor_events(tmp_path / "e" / "jobs" / "j")
    (resumed,) = [e["step"] for e in on_e if e["kind"] == "resumed"]
    assert held and resumed >= max(held), ("no older than what e held at the kill", resumed, held)
    finals = {
        h: [
            e["params_sha256"]
            for e in executor_events(tmp_path / h / "jobs" / "j")
            if e["kind"] == "finished"
        ]
        for h in "abe"
    }
    assert len({tuple(f) for f in finals.values()}) == 1 and finals["e"], finals
