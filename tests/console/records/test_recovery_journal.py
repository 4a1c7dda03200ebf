"""The journal line of an executor's end says its exit class and its cause once each
('executor on a ended: finished', not '... ended: finished: finished')."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from console.records.journal import Journal, Kind, read
from console.records.state_store import JobRecord
from console.states import HostState
from console.supervise.live import LiveJob
from console.supervise.outcome import Exit, Outcome, from_events_tail, from_run_ended, from_stopped
from console.supervise.policy import Policy
from console.supervise.recovery import Recovery
from console.supervise.restart import RestartBudget
from protocol.spec import JobSpec


class Standby:
    async def cancel_preparation(self) -> None:
        pass

    async def drop_warm(self) -> None:
        pass


class Twin:
    async def drop(self) -> None:
        pass


def recovery_of(job: LiveJob, journal: Journal, states: Any) -> Recovery:
    """A real ``Recovery`` of ``job`` on host a, its other collaborators quiet."""
    quiet: Any = SimpleNamespace(move=lambda *a, **k: None, fail=lambda *a, **k: None)
    return Recovery(
        job,
        states=states,
        incident=quiet,
        standby=Standby(),  # type: ignore[arg-type]
        twin=Twin(),  # type: ignore[arg-type]
        targets=quiet,
        fleet=SimpleNamespace(  # a fit, healthy host a
            hosts={"a": SimpleNamespace(job="j", leaving=False, state=HostState.UP)},
            failing=lambda host: [],
            changed=asyncio.Event(),
            free=lambda *a: None,
        ),  # type: ignore[arg-type]
        journal=journal,
        alert=lambda *a, **k: None,
        save=lambda: None,
        policy=lambda: Policy.AUTO,
        restarts=RestartBudget(job, states=states, incident=quiet, save=lambda: None, limit=1),
        wait_for_hosts=Standby().drop_warm,
    )


async def ended_line(tmp_path: Path, outcome: Outcome) -> str:
    """The EXECUTOR line a real ``Recovery`` journals for ``outcome`` (a job over on host a)."""
    journal = Journal(tmp_path / "journal.jsonl")
    job = LiveJob(name="j", spec=JobSpec(name="j", steps=100), rec=JobRecord(host="a"), host="a")
    quiet: Any = SimpleNamespace(move=lambda *a, **k: None, fail=lambda *a, **k: None)
    recovery = recovery_of(job, journal, quiet)
    assert await recovery.recover(outcome) is None, "the job is over"
    (line,) = [e.msg for e in read(journal.path) if e.kind is Kind.EXECUTOR]
    return line


@pytest.mark.parametrize(
    ("outcome", "said"),
    [
        (Outcome(Exit.FINISHED, "finished", 100, sha256="ab" * 32), "finished"),
        (from_stopped("operator", 40, 40), "stopped: operator"),
        (Outcome(Exit.CONFIG, "n_embd 33 is not a multiple of n_head 2"), "config: n_embd 33"),
    ],
    ids=["finished", "stopped", "config"],
)
async def test_the_executor_ended_line_says_each_word_once(
    tmp_path: Path, outcome: Outcome, said: str
) -> None:
    line = await ended_line(tmp_path, outcome)
    assert line.startswith(f"j: executor on a ended: {said}"), line
    assert line.count(outcome.exit.value) == 1, line


def test_an_outcome_names_its_class_when_its_cause_does_not() -> None:
    assert from_stopped("lease_lost", 5, None).said() == "stopped: lease_lost"
    assert from_run_ended("crash", "boom", 5).said() == "run_crash: boom"
    assert (
        from_run_ended("hang", "no step in 60s", 5).said() == "executor_hang: hang: no step in 60s"
    )
    assert from_stopped("drain", 5, 5).said() == "planned: stopped for drain"
    assert Outcome(Exit.HOST_LOST, "").said() == "host_lost"


async def test_a_finish_seen_while_reattaching_is_a_finish_not_an_illegal_transition(
    tmp_path: Path,
) -> None:
    """A console restarted while its job's last steps ran: it was still DEPLOYING (relinking)
    when the executor's Finished came. That raised IllegalTransition and ended the controller
    (a fresh-clone run at 2a7e052, test_controller_local's reattach test)."""
    from console.states import JobState
    from console.supervise.live import Transitions

    journal = Journal(tmp_path / "journal.jsonl")
    job = LiveJob(name="j", spec=JobSpec(name="j", steps=100), rec=JobRecord(host="a"), host="a")
    states = Transitions(job, journal=journal, alert=lambda *a, **k: None, alerted=lambda _: False)
    states.move(JobState.DEPLOYING, "reattaching")
    recovery = recovery_of(job, journal, states)
    outcome = Outcome(Exit.FINISHED, "finished", 100, sha256="ab" * 32)
    assert await recovery.recover(outcome) is None
    assert job.state is JobState.FINISHED and job.rec.finished_step == 100
    moves = [e.msg for e in read(journal.path) if e.kind is Kind.JOB_STATE]
    assert moves[-1] == "j: deploying -> finished (step 100)", moves


@pytest.mark.parametrize(
    ("reason", "fault_class"), [("preempted", "preemption"), ("drain", "planned")]
)
async def test_a_stop_read_from_events_jsonl_opens_the_incident_its_reason_names(
    tmp_path: Path, reason: str, fault_class: str
) -> None:
    """A SIGTERMed executor whose link closed before its Fault was read: its Stopped, read back
    from events.jsonl, still opens a preemption, not a planned move (a loaded run at 40f5ea5:
    test_sigterm_to_the_executor_migrates_with_zero_lost_steps saw 'planned')."""
    tail = json.dumps({"kind": "stopped", "reason": reason, "step": 40, "checkpoint_step": 40})
    outcome = from_events_tail(tail + "\n")
    opened: list[tuple[str, bool]] = []

    class Opened(Exception):
        pass

    def open_(fault_class: str, why: str, *, planned: bool = False) -> None:
        opened.append((fault_class, planned))
        raise Opened  # what follows (the failover) is not this test's

    journal = Journal(tmp_path / "journal.jsonl")
    job = LiveJob(name="j", spec=JobSpec(name="j", steps=100), rec=JobRecord(host="a"), host="a")
    quiet: Any = SimpleNamespace(move=lambda *a, **k: None, fail=lambda *a, **k: None)
    recovery = recovery_of(job, journal, quiet)
    recovery._incident = SimpleNamespace(open=open_, phase=lambda *a, **k: None)  # type: ignore[assignment]
    with pytest.raises(Opened):
        await recovery.recover(outcome)
    assert opened == [(fault_class, True)]
