"""What a host's GPU health asks of the job on it, one host or a group's member alike
(``console.supervise.gpu_health``): decided from Health samples, no process started. The real
moves, over real executors with the fake NVML: test_controller_local (one host) and
test_group_local (a member), both ``long``."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest
from support.jobbed import Calls, services

from console.fleet.link import ExecutorLink
from console.records.incidents import incidents
from console.records.journal import Kind, read
from console.states import HostState, JobState
from console.supervise.gpu_health import WARN_IN_A_ROW, GpuWatch
from console.supervise.member import Member
from console.supervise.outcome import Exit, Outcome
from console.supervise.policy import Policy
from console.supervise.supervisor import Supervisor
from console.supervise.what_next import unfit
from protocol.faults import StopReason
from protocol.messages import ConsoleMessage, Drain, GpuHealth, Health


def health(*, temp: float = 50.0, ecc: int = 0) -> Health:
    gpu = GpuHealth(index=0, name="Fake H100", util_pct=90.0, temp_c=temp, ecc_uncorrected=ecc)
    return Health(
        t=0.0,
        cpu_pct=10.0,
        mem_used_pct=10.0,
        mem_available_mb=10_000.0,
        disk_free_mb=10_000.0,
        disk_total_mb=20_000.0,
        gpu_status="ok: 1 GPU",
        gpus=(gpu,),
    )


HOT = health(temp=95.0)
OK = health()
FAILING = health(ecc=2)


def up(calls: Calls, tmp_path: Path) -> Any:
    svc = services(tmp_path, calls)
    for h in "abc":
        svc.fleet.set_state(h, HostState.UP, "test")
    return svc


def test_a_warning_moves_the_job_once_per_streak_a_failure_at_every_sample(
    tmp_path: Path,
) -> None:
    calls = Calls()
    calls.policy = Policy.AUTO
    svc = up(calls, tmp_path)
    watch = GpuWatch(svc.fleet, lambda: calls.policy)
    said = [watch.heard("a", HOT) for _ in range(WARN_IN_A_ROW - 1)]
    assert said == [None] * (WARN_IN_A_ROW - 1), "fewer in a row is a blip"
    call = watch.heard("a", HOT)
    assert call is not None and call.move is StopReason.MIGRATE and "95 C" in call.why
    assert call.said("a").startswith("GPU WARN on a: ")
    assert [watch.heard("a", HOT) for _ in range(3)] == [None] * 3, "once per streak"
    watch.heard("a", OK)  # the streak is broken: a new one counts from one
    assert [watch.heard("a", HOT) for _ in range(WARN_IN_A_ROW)][-1] is not None
    fails = [watch.heard("b", FAILING) for _ in range(2)]
    assert [c.move if c else None for c in fails] == [StopReason.GPU_FAIL, StopReason.GPU_FAIL]
    calls.policy = Policy.MANUAL
    assert [watch.heard("c", HOT) for _ in range(WARN_IN_A_ROW)][-1] is None, "auto only"


def test_a_lasting_warning_with_no_host_free_trains_on_and_the_journal_says_why(
    tmp_path: Path,
) -> None:
    calls = Calls()
    calls.policy = Policy.AUTO
    svc = up(calls, tmp_path)
    for h in "abc":
        svc.fleet.hosts[h].job = "busy"
    watch = GpuWatch(svc.fleet, lambda: calls.policy)
    assert [watch.heard("a", HOT) for _ in range(WARN_IN_A_ROW)] == [None] * WARN_IN_A_ROW
    (said,) = [e for e in read(svc.inv.state_dir / "journal.jsonl") if e.kind is Kind.ACTION]
    assert said.host == "a" and said.msg.endswith("no fit host is free to move to; it trains on")
    ro = GpuWatch(svc.fleet, lambda: calls.policy, acts=False)
    assert ro.heard("b", FAILING) is None, "a read-only console asks nothing"
    assert svc.fleet.failing("b"), "but records the sample"


class Wire:
    """An executor link that keeps what is sent."""

    def __init__(self) -> None:
        self.sent: list[ConsoleMessage] = []

    async def send(self, msg: ConsoleMessage) -> None:
        self.sent.append(msg)


def on_job(
    kind: str, svc: Any, wire: Wire
) -> tuple[Supervisor, Callable[[Health], None], str, Member | None]:
    """A single host's job on a, or the group's member 1 on b, running, its link ``wire``: the
    supervisor, what its host's executor says, the host, and the member (a group's)."""
    link = cast(ExecutorLink, wire)
    if kind == "one host":  # a group of one
        sup, host, m = Supervisor(svc, "j"), "a", Member(0, "a", link=link)
        sup.live.host, sup.live.link = "a", link
    else:
        sup, host, m = Supervisor(svc, "g"), "b", Member(1, "b", link=link)
    member = m

    def say(msg: Health) -> None:
        sup._messages.on_message(m, msg)

    sup.live.machine.move(JobState.DEPLOYING)
    sup.live.machine.move(JobState.RUNNING)
    return sup, say, host, member


@pytest.mark.parametrize("kind", ["one host", "group member"])
async def test_every_kind_drains_a_host_whose_gpu_fails(tmp_path: Path, kind: str) -> None:
    """One reaction for both kinds (``GpuWatch.mark``): the host drained, the rank on it told
    to checkpoint and stop, the operator alerted; draining makes the host unfit, so it is not
    marked to be left as well."""
    calls = Calls()
    svc = up(calls, tmp_path)
    wire = Wire()
    sup, say, host, _ = on_job(kind, svc, wire)
    say(FAILING)
    await asyncio.sleep(0)  # the drain is sent by a task
    assert [m.reason for m in wire.sent if isinstance(m, Drain)] == ["gpu_fail"]
    assert svc.fleet.hosts[host].state is HostState.DRAINING
    assert sup.live.leave == {}
    alerts = [args[0] for name, args in calls.made if name == "alert"]
    assert any(a.startswith(f"{host}: GPU FAIL") for a in alerts), alerts


@pytest.mark.parametrize("kind", ["one host", "group member"])
async def test_every_kind_moves_off_a_gpu_that_warns_sample_after_sample(
    tmp_path: Path, kind: str
) -> None:
    """Found in the merge of the two message paths: a group's member whose GPU warned in every
    sample was never moved (a single host's job was). Now the member's rank is drained out
    (a planned incident of class ``migrate`` naming it) and the next epoch replaces it."""
    calls = Calls()
    calls.policy = Policy.AUTO
    svc = up(calls, tmp_path)
    wire = Wire()
    sup, say, host, member = on_job(kind, svc, wire)
    for _ in range(WARN_IN_A_ROW):
        say(HOT)
    await asyncio.sleep(0)  # the drain is sent by a task
    assert [m.reason for m in wire.sent if isinstance(m, Drain)] == ["migrate"]
    (inc,) = incidents(read(svc.inv.state_dir / "journal.jsonl"))
    assert (inc.fault_class, inc.host, inc.planned) == ("migrate", host, True)
    assert sup.live.state is JobState.CHECKPOINTING
    # to be left at the next run though up and healthy: a planned stop on a fit host restarts
    # there (``what_next``), so the move itself marks the host
    assert list(sup.live.leave) == [host]
    # its stop read back: the rank is not fit to stay, though its host is up and healthy
    member.exit = Outcome(Exit.PLANNED, "stopped for migrate", 40, reason="migrate")
    assert svc.fleet.hosts[host].state is HostState.UP
    assert unfit(svc.fleet, host, member.exit, sup.live.leave)
    if kind == "group member":
        assert unfit(svc.fleet, "a", member.exit, sup.live.leave) is None, (
            "the other members stay where they are"
        )


@pytest.mark.parametrize("kind", ["one host", "group member"])
async def test_under_observe_a_failing_gpu_is_alerted_once_and_nothing_is_drained(
    tmp_path: Path, kind: str
) -> None:
    """``observe``: never act, only alert. A FAIL drained the host and moved the job under
    observe as under auto (the policy was read for warnings only). Now it is alerted once per
    streak; no Drain is sent, the host stays up, no incident opens, the job keeps running."""
    calls = Calls()
    calls.policy = Policy.OBSERVE
    svc = up(calls, tmp_path)
    wire = Wire()
    sup, say, host, _ = on_job(kind, svc, wire)
    for _ in range(3):
        say(FAILING)
    await asyncio.sleep(0)  # a drain would be sent by a task
    assert not [m for m in wire.sent if isinstance(m, Drain)]
    assert svc.fleet.hosts[host].state is HostState.UP
    assert sup.live.state is JobState.RUNNING and sup.live.leave == {}
    assert not incidents(read(svc.inv.state_dir / "journal.jsonl"))
    alerts = [args[0] for name, args in calls.made if name == "alert"]
    assert len([a for a in alerts if "GPU FAIL" in a]) == 1, alerts
    assert "observe policy drains nothing" in alerts[-1]
    say(OK)  # the streak ends; a new one is said again
    say(FAILING)
    alerts = [args[0] for name, args in calls.made if name == "alert"]
    assert len([a for a in alerts if "GPU FAIL" in a]) == 2, alerts
