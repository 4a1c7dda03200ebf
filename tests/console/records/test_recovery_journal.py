"""The journal line of an executor's end says its exit class and its cause once each
('executor on a ended: finished', not '... ended: finished: finished'); what a recovery reads
of an end (a finish while reattaching, a stop read back from events.jsonl). A job on one host,
a group of one (issue 30: one recovery); no process started."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.jobbed import Calls, recovered, running, services

from console.records.journal import Kind, read
from console.states import HostState, JobState
from console.supervise.outcome import Exit, Outcome, from_events_tail, from_run_ended, from_stopped
from console.supervise.supervisor import Supervisor


def job_on_a(tmp_path: Path, *, deployed: bool = True) -> Supervisor:
    svc = services(tmp_path, Calls())
    for h in "abc":
        svc.fleet.set_state(h, HostState.UP, "test")
    return running(svc, "one host", ["a"], deployed=deployed)


def said(sup: Supervisor, kind: Kind) -> list[str]:
    return [e.msg for e in read(sup._journal.path) if e.kind is kind]


@pytest.mark.parametrize(
    ("outcome", "said_as"),
    [
        (Outcome(Exit.FINISHED, "finished", 100, sha256="ab" * 32), "finished"),
        (from_stopped("operator", 40, 40), "stopped: operator"),
        (Outcome(Exit.CONFIG, "n_embd 33 is not a multiple of n_head 2"), "config: n_embd 33"),
    ],
    ids=["finished", "stopped", "config"],
)
async def test_the_executor_ended_line_says_each_word_once(
    tmp_path: Path, outcome: Outcome, said_as: str
) -> None:
    sup = job_on_a(tmp_path)
    assert await recovered(sup, [outcome]) is None, "the job is over"
    (line,) = said(sup, Kind.EXECUTOR)
    assert line.startswith(f"j: executor on a ended: {said_as}"), line
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
    sup = job_on_a(tmp_path, deployed=False)
    outcome = Outcome(Exit.FINISHED, "finished", 100, sha256="ab" * 32)
    assert await recovered(sup, [outcome]) is None
    assert sup.live.state is JobState.FINISHED and sup.live.rec.finished_step == 100
    moves = said(sup, Kind.JOB_STATE)
    assert moves[-1] == "j: deploying -> finished (step 100)", moves


@pytest.mark.parametrize(
    ("reason", "fault_class"), [("preempted", "preemption"), ("drain", "planned")]
)
async def test_a_stop_read_from_events_jsonl_opens_the_incident_its_reason_names(
    tmp_path: Path, reason: str, fault_class: str
) -> None:
    """A SIGTERMed executor whose link closed before its Fault was read: its Stopped, read back
    from events.jsonl, still opens a preemption, not a planned move (a loaded run at 40f5ea5:
    test_sigterm_to_the_executor_migrates_with_zero_lost_steps saw 'planned'; a group's
    member's did, until one recovery served both)."""
    tail = json.dumps({"kind": "stopped", "reason": reason, "step": 40, "checkpoint_step": 40})
    outcome = from_events_tail(tail + "\n")
    opened: list[tuple[str, str, bool]] = []

    class Opened(Exception):
        pass

    def open_(m: object, fault_class: str, why: str, *, planned: bool = False) -> None:
        opened.append((fault_class, why, planned))
        raise Opened  # what follows (the move) is not this test's

    sup = job_on_a(tmp_path)
    sup._group_recovery._open_incident = open_  # type: ignore[assignment]
    with pytest.raises(Opened):
        await recovered(sup, [outcome])
    assert [(c, p) for c, _, p in opened] == [(fault_class, True)]
    if reason == "preempted":
        assert opened[0][1] == "SIGTERM on a: checkpoint now, then move"
