"""Restart in place (``console.supervise.restart``): one decision for a single host's job and
a group's member, decided from the fleet's state alone, no process started."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest
from support.jobbed import Calls, recovered, running, say, services, supervisor
from support.manifests import manifest, saved

from console.fleet.hosts import Fleet
from console.records.journal import Kind, read
from console.states import FailureKind, HostState, JobState
from console.supervise.outcome import Exit, Outcome
from console.supervise.restart import paid_off
from console.supervise.supervisor import Supervisor
from console.supervise.what_next import Act, unfit, what_next
from protocol.messages import CheckpointSaved, GpuHealth, Health, Resumed

FAILING = Health(
    t=0.0,
    cpu_pct=1.0,
    mem_used_pct=1.0,
    mem_available_mb=1e4,
    disk_free_mb=1e4,
    disk_total_mb=2e4,
    gpus=(GpuHealth(index=0, lost=True),),
)


def _up(fleet: Fleet, host: str) -> None:
    fleet.set_state(host, HostState.UP, "test")


CONDITIONS: dict[str, Callable[[Fleet, dict[str, str]], None]] = {
    "up": lambda fleet, leave: None,
    "suspect": lambda fleet, leave: fleet.set_state("a", HostState.SUSPECT, "test"),
    "cordoned": lambda fleet, leave: fleet.set_state("a", HostState.CORDONED, "test"),
    "draining": lambda fleet, leave: fleet.set_state("a", HostState.DRAINING, "test"),
    "down": lambda fleet, leave: fleet.set_state("a", HostState.DOWN, "test"),
    "failing a health rule": lambda fleet, leave: fleet.observe("a", FAILING) and None,
    "being released": lambda fleet, leave: setattr(fleet.hosts["a"], "releasing", True),
    "to be left (GPU warned)": lambda fleet, leave: leave.update(a="its GPU warned"),
}
STAYS = {"up", "suspect", "cordoned"}


@pytest.mark.parametrize("condition", list(CONDITIONS))
def test_a_single_host_and_a_groups_member_may_restart_on_the_same_hosts(
    tmp_path: Path, condition: str
) -> None:
    """Found in the merge: a single host's job restarted on a host failing a health rule that
    was not drained yet (a group's member moved off it). Both kinds now ask ``what_next.unfit``
    and ``what_next``: a crash on ``a`` restarts in place, or moves the rank off ``a``."""
    svc = services(tmp_path, Calls())
    for h in "abc":
        _up(svc.fleet, h)
    leave: dict[str, str] = {}
    CONDITIONS[condition](svc.fleet, leave)
    crashed = Outcome(Exit.CRASHED, "crashed")
    why = unfit(svc.fleet, "a", crashed, leave)
    assert (why is None) is (condition in STAYS), why
    one = what_next([crashed], 0, stop_requested=False, unfit=[why])
    group = what_next(
        [crashed, Outcome(Exit.RUN_CRASHED, "its peer went")],
        0,
        stop_requested=False,
        unfit=[why, None],
    )
    if condition in STAYS:
        assert (one.act, group.act) == (Act.RESTART, Act.RESTART)
    else:
        assert (one.act, one.replace, group.act, group.replace) == (
            Act.REPLACE,
            (0,),
            Act.REPLACE,
            (0,),
        )


def test_the_restart_budget_counts_in_the_record_and_says_when_it_is_spent(
    tmp_path: Path,
) -> None:
    svc = services(tmp_path, Calls())
    one = Supervisor(svc, "j")
    limit = svc.inv.console.restart_limit
    for n in range(1, limit + 1):
        one.live.machine.move(JobState.DEPLOYING)
        one.live.machine.move(JobState.RUNNING)
        assert one._restarts.take("a", "crashed", 10 * n)
        assert one.live.rec.restarts == n and one.live.state is JobState.RESTARTING
        assert one.live.why.endswith(f"restart {n} of {limit} on a")
    one.live.machine.move(JobState.DEPLOYING)
    one.live.machine.move(JobState.RUNNING)
    assert not one._restarts.take("a", "crashed", 99), "the limit reached: the job moves"
    assert one.live.state is JobState.RUNNING and one.live.rec.restarts == limit


@pytest.mark.parametrize(
    ("case", "expected"),
    [("spare fit", "c"), ("spare cordoned", "e"), ("e another job's spare", "d")],
)
async def test_a_single_host_and_a_groups_member_leaving_a_go_to_the_same_host(
    tmp_path: Path, case: str, expected: str
) -> None:
    """One failover choice (``placement.failover_order`` and ``automatic``): the job's spare,
    else the nearest free host (e shares a's region, d does not), never another job's spare.
    The group's recovery had its own copy of that order."""
    picks = []
    for kind in ("one host", "group"):
        (tmp_path / kind).mkdir()
        svc = services(tmp_path / kind, Calls(), more={"d": "r2", "e": "r1"})
        if case == "e another job's spare":
            svc = dataclasses.replace(svc, reserved=lambda job: {"e": "other"})
        for h in "abcde":
            _up(svc.fleet, h)
        if case != "spare fit":
            svc.fleet.set_state("c", HostState.CORDONED, "test")
        if kind == "one host":
            one = Supervisor(svc, "j")
            one._assign_members(["a"])
            one.live.spares = ["c"]
            svc.fleet.hosts["b"].job = "busy"  # as b trains the group's other rank
            picks.append((await one._group_recovery.targets(["a"], survivors=0) or [None])[0])
        else:
            group = Supervisor(svc, "g")
            group._assign_members(["a", "b"])
            group.live.spares = ["c"]
            picks.append((await group._group_recovery.targets(["a"], survivors=1) or [None])[0])
    assert picks == [expected, expected]


def test_a_budget_spent_on_a_second_host_is_a_crash_loop_and_a_checkpoint_forgives_it(
    tmp_path: Path,
) -> None:
    svc = services(tmp_path, Calls())
    one = Supervisor(svc, "j")
    assert one._restarts.spent_on("a", "boom") is None, "the first host: the job moves"
    assert one._restarts.spent_on("a", "boom") is None, "counted once"
    assert one.live.rec.crash_looped == ["a"]
    why = one._restarts.spent_on("c", "boom")
    assert why is not None and "crash-looped on a and then c" in why and "boom" in why
    paid_off(one.live.rec)
    assert one.live.rec.crash_looped == [] and one.live.rec.restarts == 0
    assert one._restarts.spent_on("c", "boom") is None


@pytest.mark.parametrize("kind", ["one host", "group"])
async def test_a_run_that_crash_loops_on_its_second_host_fails_the_job_not_moves_it(
    tmp_path: Path, kind: str
) -> None:
    """A crash in the job's code or data follows it to every host: after the restarts on a
    and then on c, the job fails as a crash loop; before, it went back to a, then c, for ever
    (scripts/test-long: a group between two provisioned hosts, 240 s, until the test's end)."""
    svc = services(tmp_path, Calls())
    for h in "abc":
        _up(svc.fleet, h)
    crashed = Outcome(Exit.CRASHED, "crashed: ValueError: bad batch")
    sup = running(svc, kind, ["c", "b"])
    live = sup.live
    live.rec.crash_looped = ["a"]  # it ran out of restarts on a, and moved to c
    live.rec.restarts = svc.inv.console.restart_limit  # and out of them on c too
    # a recovery that moves the job waits for a host here (none is free): a deadline, not a hang
    assert await recovered(sup, [crashed, crashed]) is None
    assert live.state is JobState.FAILED and live.failure is FailureKind.CRASH_LOOP
    assert "crash-looped on a and then c" in live.why
    assert live.rec.crash_looped == ["a", "c"]


def _saved(step: int, shard: int, nnodes: int) -> CheckpointSaved:
    return saved(manifest(step, node_rank=shard, nnodes=nnodes))


@pytest.mark.parametrize("kind", ["one host", "group"])
async def test_a_whole_checkpoint_past_the_resumed_step_forgives_the_restarts_and_says_so(
    tmp_path: Path, kind: str
) -> None:
    """One rule for both handlers (``console.supervise.said``): a checkpoint at the step the
    restart resumed from forgives nothing; one past it, once whole (every shard of a group's
    step), sets the count back to 0 and the journal says so. The group's handler reset the
    count without a word."""
    svc = services(tmp_path, Calls())
    members = ["a"] if kind == "one host" else ["a", "b"]
    sup = supervisor(svc, kind, members)
    live = sup.live
    live.rec.restarts = 1
    say(sup, "a", Resumed(step=40, checkpoint="step-40", epoch=1, load_s=0.1))
    for host in members:
        say(sup, host, _saved(40, members.index(host), len(members)))
    assert live.rec.restarts == 1, "the step it resumed from again: nothing new trained"
    say(sup, "a", _saved(60, 0, len(members)))
    if kind == "group":
        assert live.rec.restarts == 1, "one shard of step 60: not yet a whole checkpoint"
        say(sup, "b", _saved(60, 1, len(members)))
    assert live.rec.restarts == 0
    said = [e.msg for e in read(svc.journal.path) if e.kind is Kind.EXECUTOR]
    assert said == [
        f"{live.name}: checkpoint at step 60 after 1 restart(s); the restart count starts again"
    ]


@pytest.mark.parametrize("kind", ["one host", "group"])
def test_an_ended_job_frees_every_host_it_held_and_keeps_no_spares(
    tmp_path: Path, kind: str
) -> None:
    """One release for both kinds (``finish.release``): the job's own hosts and a target
    readied for it are free for other jobs; the single host's freed its own host only."""
    svc = services(tmp_path, Calls())
    for h in "abc":
        _up(svc.fleet, h)
    sup = supervisor(svc, kind, ["a"] if kind == "one host" else ["a", "b"])
    live, release = sup.live, sup._group_recovery.release
    live.spares = ["c"]
    svc.fleet.hosts["c"].job = live.name  # readied as a failover's target when it ended
    release()
    assert {h: rt.job for h, rt in svc.fleet.hosts.items() if rt.job} == {}
    assert live.spares == []
    assert svc.fleet.usable() >= {"a", "c"}
