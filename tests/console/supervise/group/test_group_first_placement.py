"""Where a group starts: on its member hosts that may take a job, as a single host's job is
placed only on a usable host."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path

import pytest
from support.fleetbed import EXECUTOR_ENV, local_host, stdlib_job, until, write_inventory
from support.groupbed import controller, local_group

from console.controller import Controller
from console.inventory import load
from console.records.journal import Kind, read
from console.states import HostState, JobState
from console.supervise.policy import Policy


@pytest.mark.parametrize(
    "order",
    [
        "cordon",
        # the suite gives a cordoned host's rank to the spare (cordon), on the same path; the
        # rule for each state, drained too, without a process (below)
        pytest.param("drain", marks=pytest.mark.long),
    ],
)
async def test_a_member_host_cordoned_or_drained_before_the_start_gives_its_rank_to_the_spare(
    tmp_path: Path, order: str
) -> None:
    """c is cordoned (or drained) before the group's first epoch: its rank starts on the
    spare d, and nothing of the job ever runs on c. The group started on c regardless."""
    inv = local_group(tmp_path, steps=60)
    ctl = controller(inv)
    getattr(ctl, "cordon" if order == "cordon" else "drain_host")("c")
    await asyncio.wait_for(ctl.run(), 120)
    await ctl.close()
    sup = ctl.jobs["j"]
    assert sup.state is JobState.FINISHED, sup.live.why
    assert ctl.store.job("j").members == ["a", "b", "d"]
    assert not (tmp_path / "c" / "jobs" / "j").exists(), "no executor of the job on c"
    state = HostState.CORDONED if order == "cordon" else HostState.DRAINED
    assert ctl.fleet.hosts["c"].state is state
    placed = [
        e.msg for e in read(inv.parent / "state" / "journal.jsonl") if e.kind is Kind.PLACEMENT
    ]
    assert f"j: c is {state.value}: its rank starts on d" in placed, placed


@pytest.mark.parametrize(
    ("path", "moved"),
    [
        ((HostState.CORDONED,), True),
        ((HostState.DRAINING,), True),
        ((HostState.DRAINING, HostState.DRAINED), True),
        ((HostState.DOWN,), False),  # judged by its deploy: the recovery replaces it then
        ((HostState.SUSPECT,), False),
        ((), False),
    ],
    ids=["cordoned", "draining", "drained", "down", "suspect", "up"],
)
async def test_which_member_hosts_a_first_placement_gives_to_a_spare(
    tmp_path: Path, path: tuple[HostState, ...], moved: bool
) -> None:
    """The rule, no process started: the group g on a and b, spare c, b's host in each state."""
    from support.jobbed import Calls, services

    from console.supervise.supervisor import Supervisor

    svc = services(tmp_path, Calls())
    for h in "abc":
        svc.fleet.set_state(h, HostState.UP, "test")
    for state in path:
        svc.fleet.set_state("b", state, "test")
    if HostState.DOWN in path:  # as the fleet's probe leaves a host it finds down
        svc.fleet.probe_failed("b", "health probe failed: b: host is down")
    g = Supervisor(svc, "g")
    g.live.spares = ["c"]
    assert await asyncio.wait_for(g._first.place(), 5) == ([1] if moved else [])
    assert g.members == (["a", "c"] if moved else ["a", "b"])
    assert g.live.rec.members == (g.members if moved else []), "a move persisted at once"


async def test_a_host_whose_probe_failed_before_it_reads_down_is_left_to_its_deploy(
    tmp_path: Path,
) -> None:
    """The fleet's probe says b cannot be reached a moment before b reads down: that is a
    fault, judged by b's deploy (a failover that asks under manual), not a health rule that
    moves its rank quietly (found by the long denied-failover test, under load)."""
    from support.jobbed import Calls, services

    from console.supervise.supervisor import Supervisor

    svc = services(tmp_path, Calls())
    for h in "abc":
        svc.fleet.set_state(h, HostState.UP, "test")
    svc.fleet.probe_failed("b", "health probe failed: b: host is down")
    g = Supervisor(svc, "g")
    g.live.spares = ["c"]
    assert await asyncio.wait_for(g._first.place(), 5) == []
    assert g.members == ["a", "b"]


async def test_a_first_placement_with_no_usable_host_waits_saying_it_is_a_start(
    tmp_path: Path,
) -> None:
    """b cordoned and no spare: the group waits for a host, with a note that says which member
    host it waits to replace and why (it read 'no spare left', a recovery's words, at a start)."""
    from support.jobbed import Calls, services

    from console.supervise.live import JobState as State
    from console.supervise.supervisor import Supervisor

    svc = services(tmp_path, Calls())
    for h in "abc":
        svc.fleet.set_state(h, HostState.UP, "test")
    svc.fleet.set_state("b", HostState.CORDONED, "test")
    svc.fleet.set_state("c", HostState.CORDONED, "test")
    never = asyncio.Event()
    svc = dataclasses.replace(svc, wait_for_hosts=never.wait)  # no host comes
    g = Supervisor(svc, "g")
    g.live.spares = ["c"]
    placing = asyncio.create_task(g._first.place())
    try:
        deadline = asyncio.get_running_loop().time() + 5
        while g.live.state is not State.PENDING or "waits" not in g.live.why:
            assert asyncio.get_running_loop().time() < deadline, g.live.why
            await asyncio.sleep(0.01)
        assert g.live.why == "no usable host for g in place of b (is cordoned): it waits for a host"
        assert not placing.done() and g.members == ["a", "b"], "nothing placed while it waits"
    finally:
        placing.cancel()
        await asyncio.gather(placing, return_exceptions=True)


async def test_a_job_declared_by_its_region_alone_starts_on_a_host_of_that_region(
    tmp_path: Path,
) -> None:
    """No ``host``: the job starts on the best usable host of its region (``choose_primary``),
    as a group of one, and finishes there; a's region is another. Issue 30's one supervisor
    found it had no member to start (the single host's placement was its own)."""
    inv = write_inventory(
        tmp_path / "inventory.toml",
        hosts={"a": local_host(tmp_path / "a"), "b": local_host(tmp_path / "b", region="r2")},
        jobs={"j": {"region": "r2", **stdlib_job(steps=30)}},
    )
    ctl = Controller(load(inv), Policy.AUTO, executor_env={h: dict(EXECUTOR_ENV) for h in "ab"})
    await asyncio.wait_for(ctl.run(), 120)
    await ctl.close()
    sup = ctl.jobs["j"]
    assert sup.state is JobState.FINISHED, sup.live.why
    assert (ctl.store.job("j").host, ctl.store.job("j").spares) == ("b", ["a"])
    trained = (tmp_path / "b" / "jobs" / "j" / "events.jsonl").read_text()
    assert '"kind":"finished"' in trained, "b's executor trained it to its end"


async def test_a_job_started_again_off_its_cordoned_host_resumes_from_its_replica(
    tmp_path: Path,
) -> None:
    """Stopped by an operator, a cordoned, then started again: its rank starts on the spare b,
    from the replica of its stop's checkpoint there (promoted), not from step 0. Issue 30's one
    supervisor started it on b saying "resuming from committed step N" while b's executor,
    finding no step N of its own, loaded nothing and trained from step 0."""
    inv = write_inventory(
        tmp_path / "inventory.toml",
        hosts={"a": local_host(tmp_path / "a"), "b": local_host(tmp_path / "b", role="spare")},
        jobs={"j": {"host": "a", "spares": ["b"], **stdlib_job(steps=100_000)}},
    )
    ctl = Controller(load(inv), Policy.AUTO, executor_env={h: dict(EXECUTOR_ENV) for h in "ab"})
    task = asyncio.create_task(ctl.run(stay=True))
    sup = ctl.jobs["j"]
    try:
        await until(lambda: sup.step >= 40 or task.done(), 120, "step 40")
        ctl.stop_job("j")
        await until(lambda: ctl.jobs["j"].state is JobState.STOPPED, 60, "j stopped")
        stop = ctl.jobs["j"].commits.committed or 0
        replicated = tmp_path / "b" / "replicas" / "j" / f"step-{stop:010d}.json"
        await until(replicated.is_file, 60, f"the stop's step {stop} replicated to b")
        ctl.cordon("a")
        ctl.start_job("j")
        events = tmp_path / "b" / "jobs" / "j" / "events.jsonl"
        await until(
            lambda: events.is_file() and '"kind":"resumed"' in events.read_text(), 120, "b resumed"
        )
    finally:
        ctl.stop_job("j")
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await ctl.close()
    resumed = [json.loads(line) for line in events.read_text().splitlines() if '"resumed"' in line]
    assert resumed[0]["step"] == stop >= 40, (resumed[0], stop)
    said = [e.msg for e in read(inv.parent / "state" / "journal.jsonl") if "epoch 2 on" in e.msg]
    assert said == [
        f"j: epoch 2 on b, master {said[0].split('master ')[1].split(',')[0]}, "
        f"resuming from committed step {stop}"
    ], said
