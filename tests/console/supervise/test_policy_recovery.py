"""What each policy lets a recovery do alone, the same for a single host's job and a group's
(``approval.approved``), with no process started. ``manual``: a failover after a fault waits
for an operator; a restart in place and a planned move go ahead. ``observe``: never acts
alone, so every recovery waits; an operator's drain is the operator's own ask.

Found in review: under observe a crash restarted in place alone (both kinds); under manual a
single host's drain asked an operator again to move the job it was drained for, where a
group's went ahead; under observe a group's planned move went ahead unasked."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from support.jobbed import Calls, recovered, running, services
from support.wait import until

from console.states import HostState, JobState
from console.supervise.outcome import Exit, Outcome
from console.supervise.policy import Policy
from console.supervise.supervisor import Supervisor

CRASH = Outcome(Exit.CRASHED, "crashed: boom", 7)
RUN_CRASH = Outcome(Exit.RUN_CRASHED, "its collective failed", 7)
PEER = Outcome(Exit.STOPPED, "stopped: peer_stopped", 7, reason="peer_stopped")
DRAINED = Outcome(Exit.PLANNED, "stopped for drain", 7, reason="drain")
PREEMPTED = Outcome(Exit.PLANNED, "stopped for preempted", 7, reason="preempted")
KINDS = ["one host", "group"]


def job(tmp_path: Path, kind: str, policy: Policy) -> tuple[Calls, Supervisor]:
    calls = Calls()
    calls.policy = policy
    svc = services(tmp_path, calls)
    for h in "abc":
        svc.fleet.set_state(h, HostState.UP, "test")
    sup = running(svc, kind, ["a", "b"])

    async def step(new: list[int], planned: bool = False) -> int | None:
        return 20

    sup._resume.step = step  # type: ignore[method-assign]
    return calls, sup


def ends(kind: str, end: Outcome) -> list[Outcome]:
    """The run's ends: ``end`` on a, and (a group) b stopped with it."""
    return [end] if kind == "one host" else [end, PEER if end.exit is Exit.PLANNED else RUN_CRASH]


def asked(calls: Calls) -> list[str]:
    return [args[0] for name, args in calls.made if name == "alert" and "in the console" in args[0]]


async def moves_unasked(calls: Calls, sup: Supervisor, run: list[Outcome]) -> None:
    """The recovery of a run that ended so goes on to move the job (to spare c) and asks no
    operator."""
    recovering = asyncio.create_task(recovered(sup, run))
    await until(
        lambda: sup.live.approval is not None or recovering.done() or "c" in sup.hosts_in_use(),
        10,
        "the move or an ask",
    )
    assert sup.live.approval is None and not asked(calls), asked(calls)
    recovering.cancel()
    await asyncio.gather(recovering, return_exceptions=True)


@pytest.mark.parametrize("kind", KINDS)
async def test_under_observe_a_crash_waits_for_an_operator_before_its_restart_in_place(
    tmp_path: Path, kind: str
) -> None:
    calls, sup = job(tmp_path, kind, Policy.OBSERVE)
    recovering = asyncio.create_task(recovered(sup, ends(kind, CRASH)))
    await until(lambda: sup.live.approval is not None or recovering.done(), 10, "an ask")
    assert not recovering.done(), recovering.result()
    assert sup.live.state is JobState.PENDING, sup.live.state
    (said,) = asked(calls)
    assert "needs a restart" in said and "go ahead by hand in the console" in said, said
    assert sup.answer(True)
    got = await recovering
    assert got == (20,), got


@pytest.mark.parametrize("kind", KINDS)
async def test_under_observe_a_denied_restart_stops_the_job(tmp_path: Path, kind: str) -> None:
    _, sup = job(tmp_path, kind, Policy.OBSERVE)
    recovering = asyncio.create_task(recovered(sup, ends(kind, CRASH)))
    await until(lambda: sup.live.approval is not None or recovering.done(), 10, "an ask")
    assert sup.answer(False)
    assert await recovering is None
    assert sup.live.state is JobState.STOPPED, sup.live.state
    assert sup.live.why == "recovery denied by an operator", "a restart is no failover"
    assert sup.live.rec.stopped, "remembered: a console started later does not restart it"


@pytest.mark.parametrize("kind", KINDS)
async def test_under_manual_a_crash_restarts_in_place_unasked(tmp_path: Path, kind: str) -> None:
    calls, sup = job(tmp_path, kind, Policy.MANUAL)
    got = await recovered(sup, ends(kind, CRASH))
    assert got == (20,), got
    assert not asked(calls) and sup.live.approval is None


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("policy", [Policy.MANUAL, Policy.OBSERVE])
async def test_an_operators_drain_moves_the_job_unasked(
    tmp_path: Path, kind: str, policy: Policy
) -> None:
    """The operator drained the host: the move is theirs, asked once (a single host's job
    under manual asked again before it moved; a group's did not)."""
    calls, sup = job(tmp_path, kind, policy)
    sup._fleet.set_state("a", HostState.DRAINING, "operator")
    await moves_unasked(calls, sup, ends(kind, DRAINED))


@pytest.mark.parametrize("kind", KINDS)
async def test_under_observe_a_preemptions_move_waits_under_manual_it_goes_ahead(
    tmp_path: Path, kind: str
) -> None:
    """A preemption notice is no operator's ask: under observe its move waits for one (a
    group's went ahead unasked); under manual it goes ahead, a planned move."""
    calls, sup = job(tmp_path, kind, Policy.OBSERVE)
    sup._fleet.set_state("a", HostState.DRAINING, "preempted")  # the host is going
    recovering = asyncio.create_task(recovered(sup, ends(kind, PREEMPTED)))
    await until(lambda: sup.live.approval is not None or recovering.done(), 10, "an ask")
    assert not recovering.done(), recovering.result()
    (said,) = asked(calls)
    assert "go ahead by hand" in said, said
    recovering.cancel()
    await asyncio.gather(recovering, return_exceptions=True)

    (tmp_path / "manual").mkdir()
    calls, sup = job(tmp_path / "manual", kind, Policy.MANUAL)
    sup._fleet.set_state("a", HostState.DRAINING, "preempted")
    await moves_unasked(calls, sup, ends(kind, PREEMPTED))
