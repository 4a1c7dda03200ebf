"""A job's supervisor reaches the fleet-wide controller only through ``JobServices``."""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path

import pytest
from support.helpers import parsed
from support.jobbed import Calls, services

from console import clock
from console.records.incidents import Resolution, incidents
from console.records.journal import Kind, read
from console.states import HostState, JobState
from console.supervise.member import Member
from console.supervise.outcome import Exit
from console.supervise.policy import Policy
from console.supervise.supervisor import Supervisor
from protocol.faults import FaultKind
from protocol.messages import (
    ExecutorMessage,
    ExecutorState,
    Fault,
    Finished,
    Heartbeat,
    Log,
    LogLevel,
    Progress,
    Resumed,
    RunEnded,
)

CONSOLE = Path(__file__).resolve().parents[3] / "console"
ROOMS = [CONSOLE / r for r in ("supervise", "spares", "replication")]
"""Where a job's supervision and what it uses live: none of it imports the controller."""


def imported(path: Path) -> set[str]:
    """Every module ``path`` imports, type-checking-only imports included."""
    found: set[str] = set()
    for node in ast.walk(parsed(path)):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return found


def test_nothing_a_job_uses_imports_the_controller() -> None:
    files = [p for room in ROOMS for p in sorted(room.rglob("*.py"))]
    assert len(files) > 30
    users = [str(p.relative_to(CONSOLE)) for p in files if "console.controller" in imported(p)]
    assert users == []


def test_a_supervisor_of_either_kind_is_built_from_the_services_alone(tmp_path: Path) -> None:
    calls = Calls()
    svc = services(tmp_path, calls)
    one, group = Supervisor(svc, "j"), Supervisor(svc, "g")
    assert one.members == ["a"], "a job on one host is a group of one"
    assert one.state is JobState.PENDING and group.state is JobState.PENDING
    assert group.members == ["a", "b"]
    assert calls.made == [], "building a supervisor decides nothing"
    # the policy is read when used: an operator's change reaches a job built before it
    calls.policy = Policy.AUTO
    assert group._policy() is Policy.AUTO


def test_a_group_stopped_before_its_next_epoch_frees_every_member(tmp_path: Path) -> None:
    """An operator's stop that found no executor to tell (the group between epochs) frees all
    its hosts, not only rank 0's: the group's supervisor took the single host's release."""
    calls = Calls()
    svc = services(tmp_path, calls)
    group = Supervisor(svc, "g")
    group._assign_members(["a", "b"])
    assert {h for h, rt in svc.fleet.hosts.items() if rt.job == "g"} == {"a", "b"}
    group.request_stop()
    assert group._stop_before_start()
    assert group.state is JobState.STOPPED and svc.store.job("g").stopped
    assert {h for h, rt in svc.fleet.hosts.items() if rt.job == "g"} == set()


@pytest.mark.parametrize("kind", ["one host", "group member"])
async def test_every_kind_journals_an_executors_warning_once_and_alerts_a_drifting_clock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """Found in the merge of the two message paths: a group's members had neither (their
    warnings reached the log tail only, their clocks were never checked against the lease's
    assumption). The console's clock is driven here; the executor's runs 20% slow."""
    calls = Calls()
    svc = services(tmp_path, calls)
    now = [1000.0]
    monkeypatch.setattr(clock, "mono", lambda: now[0])
    say: Callable[[ExecutorMessage], None]
    if kind == "one host":
        one, host = Supervisor(svc, "j"), "a"

        def say(msg: ExecutorMessage) -> None:
            one._messages.on_message(Member(0, "a"), msg)
    else:
        group, member = Supervisor(svc, "g"), Member(1, "b")
        host = "b"

        def say(msg: ExecutorMessage) -> None:
            group._messages.on_message(member, msg)

    say(Log(level=LogLevel.WARNING, text="120 lines of command output dropped"))
    say(Log(level=LogLevel.WARNING, text="130 lines of command output dropped"))  # the same
    say(Log(level=LogLevel.STDERR, text="a line of the command's own"))
    warnings = [e for e in read(svc.inv.state_dir / "journal.jsonl") if e.kind is Kind.WARNING]
    assert [(e.host, e.msg.split(": ", 1)[1]) for e in warnings] == [
        (host, "120 lines of command output dropped")
    ]
    lease = svc.inv.console.lease_s
    for i in range(int(3 * lease) + 1):
        now[0] = 1000.0 + i
        beat = Heartbeat(
            seq=i, t=0.0, state=ExecutorState.TRAINING, step=0, epoch=1, clock=500.0 + 0.8 * i
        )
        say(beat)
    drifted = [args[0] for name, args in calls.made if name == "alert" and "drifted" in args[0]]
    assert drifted and drifted[0].startswith(f"{host}: its clock"), calls.made

    # a lost lease's fault is journalled with the evidence that tells a lapse from a loss
    say(Fault(fault=FaultKind.LEASE_LOST, message="lease ended", step=7))
    faults = [e for e in read(svc.inv.state_dir / "journal.jsonl") if e.kind is Kind.FAULT]
    assert [(e.host, e.data["fault"], e.data["step"]) for e in faults] == [(host, "lease_lost", 7)]
    assert {"granted_ago_s", "grant_gap_s", "loop_stall_s"} <= set(faults[0].data)
    assert faults[0].data.get("node_rank") == (None if kind == "one host" else 1)


@pytest.mark.parametrize("kind", ["one host", "group"])
def test_every_kind_opens_an_incident_for_a_nan_an_oom_and_a_preemption_its_executor_reports(
    tmp_path: Path, kind: str
) -> None:
    """A NaN and an OOM are handled inside the executor (roll back, halve the micro-batch):
    an incident all the same, of the host that saw it, resolved at the first step trained after
    it. A group's members had none (only a single host's did): its report left them out. In a
    group every member sees a NaN (the loss is reduced): one incident, of the first heard."""
    calls = Calls()
    svc = services(tmp_path, calls)
    say: Callable[[ExecutorMessage], None]
    if kind == "one host":
        one, host = Supervisor(svc, "j"), "a"
        one.live.host = "a"

        def say(msg: ExecutorMessage) -> None:
            one._messages.on_message(Member(0, "a"), msg)
    else:
        group, host = Supervisor(svc, "g"), "b"
        rank0, rank1 = Member(0, "a"), Member(1, "b")
        group.live.host = "a"

        def say(msg: ExecutorMessage) -> None:  # rank 1 is heard first, then rank 0
            for m in (rank1, rank0) if isinstance(msg, Fault) else (rank0, rank1):
                group._messages.on_message(m, msg)

    def progress(step: int) -> Progress:
        return Progress(step=step, steps=240, loss=1.0, steps_per_s=10.0)

    say(progress(50))
    say(Fault(fault=FaultKind.NAN, message="loss nan at step 51", step=51))
    say(Resumed(step=40, checkpoint=None, epoch=1, load_s=0.0))
    say(progress(41))
    say(Fault(fault=FaultKind.OOM, message="out of memory at step 60", step=60))
    say(progress(60))
    say(Fault(fault=FaultKind.PREEMPTED, message="SIGTERM", step=70))
    found = incidents(read(svc.inv.state_dir / "journal.jsonl"))
    assert [(i.fault_class, i.host, i.planned) for i in found] == [
        ("nan", host, False),
        ("oom", host, False),
        ("preemption", host, True),
    ]
    nan, oom, preempted = found
    assert (nan.resolution, nan.resumed_step, nan.last_step) == (Resolution.RECOVERED, 40, 50)
    assert (oom.resolution, oom.lost_steps) == (Resolution.RECOVERED, 0)
    assert preempted.resolution is Resolution.OPEN, "its move is still to come"
    assert f"SIGTERM on {host}" in preempted.lines[0].msg


@pytest.mark.parametrize("kind", ["one host", "group"])
def test_every_kind_keeps_its_fit_spares_at_a_launch_and_replaces_the_unfit(
    tmp_path: Path, kind: str
) -> None:
    """One placement rule (``Supervisor._assign``): a spare still fit and free is kept at the
    next launch (it holds the job's replicas), an unfit one replaced, a member never one. A
    single host's job chose afresh at each launch and left a spare holding its replicas for the
    one its inventory names; a group kept even an unfit spare until none was left."""
    calls = Calls()
    svc = services(tmp_path, calls)
    for h in "abc":
        svc.fleet.set_state(h, HostState.UP, "test")
    if kind == "one host":
        sup, hosts, spare, other = Supervisor(svc, "j"), ["a"], "b", "c"  # c: j's named spare
    else:
        sup, hosts, spare, other = Supervisor(svc, "g"), ["a", "c"], "b", ""
    sup.live.spares = [spare]
    sup._assignment.place(hosts)
    assert sup.live.spares == [spare] and sup.live.rec.spares == [spare]
    assert {h for h, rt in svc.fleet.hosts.items() if rt.job == sup.name} == set(hosts)
    svc.fleet.set_state(spare, HostState.CORDONED, "an operator's cordon")
    sup._assignment.place(hosts)
    assert sup.live.spares == ([other] if other else []), "the unfit spare is replaced"
    if not other:
        assert ("need_host", (f"job {sup.name} has no spare",)) in calls.made
    placed = [e for e in read(svc.inv.state_dir / "journal.jsonl") if e.kind is Kind.PLACEMENT]
    assert [e.data["members"] for e in placed] == [hosts, hosts]


@pytest.mark.parametrize("kind", ["one host", "group"])
def test_an_incident_whose_recovery_resumed_at_the_last_step_is_resolved_by_the_finish(
    tmp_path: Path, kind: str
) -> None:
    """Chaos seed 30 of the 200-fault torchrun run: a host lost just after its job's last
    step; the spare promoted that step's replica, loaded it and finished with no step left to
    train, so no Progress came after, and the incident stayed open on a finished job."""
    calls = Calls()
    svc = services(tmp_path, calls)
    say: Callable[[ExecutorMessage], None]
    if kind == "one host":
        one = sup = Supervisor(svc, "j")
        one.live.host = "a"

        def say(msg: ExecutorMessage) -> None:
            one._messages.on_message(Member(0, "a"), msg)
    else:
        group = sup = Supervisor(svc, "g")
        group.live.host = "a"

        def say(msg: ExecutorMessage) -> None:
            for m in (Member(0, "a"), Member(1, "b")):
                group._messages.on_message(m, msg)

    sup.live.step = 9400
    sup._incident.open("host_lost", "c unreachable past its lease")
    say(Resumed(step=9400, checkpoint=None, epoch=2, load_s=0.0))
    say(Finished(step=9400, params_sha256="ab" * 32))
    (inc,) = incidents(read(svc.inv.state_dir / "journal.jsonl"))
    assert inc.resolution is Resolution.RECOVERED and inc.lost_steps == 0
    assert sup.live.incident is None


def test_only_rank_zero_speaks_for_the_jobs_step_a_members_run_end_is_its_own(
    tmp_path: Path,
) -> None:
    """The one dispatcher (``JobMessages``): a group's member 1 training ahead moves neither
    the job's step nor its liveness, and its incident stays open, where rank 0's step does
    both; a member's Finished or RunEnded is returned as that member's end, the same reading
    as a single host's (``outcome.run_end``)."""
    svc = services(tmp_path, Calls())
    group = Supervisor(svc, "g")
    group._assign_members(["a", "b"])
    live = group.live
    live.incident, live.resumed_step = 3, 10
    ahead = Progress(step=12, steps=100, loss=0.5, steps_per_s=4.0)
    assert group._messages.on_message(Member(1, "b"), ahead) is None
    assert (live.step, live.incident, live.last_seen) == (0, 3, 0.0), "member 1 is not the job"
    assert group._messages.on_message(Member(0, "a"), ahead) is None
    assert live.step == 12 and live.incident is None and live.last_seen > 0
    ended = group._messages.on_message(
        Member(1, "b"), RunEnded(step=12, fault=FaultKind.CRASH, message="exit 1", exit_code=1)
    )
    assert ended is not None and ended.exit is Exit.RUN_CRASHED and ended.step == 12
    done = group._messages.on_message(Member(0, "a"), Finished(step=100, params_sha256="ab"))
    assert done is not None and done.exit is Exit.FINISHED and done.sha256 == "ab"
