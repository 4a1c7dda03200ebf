"""The post-mortem adds up (issue 29, item 3): on each path a job can take through an incident
(a failover denied then the job started again, approved, stopped and started, drained, the
console restarted during an incident, a job resumed from step 0), ``hotspare report`` is
checked against independent evidence: the journal's own events and what the executors wrote
in their workdirs (``events.jsonl``: every Progress and Resumed they sent; the checkpoint
manifests on disk).

Before: a denied failover left its incident ``resolved no`` with MTTR ``-`` forever, the
start after it opened a second incident "not reachable at console start" though no console
had started, the steps it lost were counted as 0, and the report printed ``resumed at None``.
"""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path
from typing import Any

import pytest
from support.fleetbed import EXECUTOR_ENV, local_host, stdlib_job, until, write_inventory

from console.controller import Controller
from console.inventory import load
from console.records.incidents import incidents
from console.records.journal import Event, Kind, read
from console.records.report import write_report
from console.states import JobState
from console.supervise.policy import Policy


def fleet(tmp_path: Path, **job: Any) -> Path:
    over = {"steps": 5000, "keep_checkpoints": 50, **job}
    return write_inventory(
        tmp_path / "inventory.toml",
        hosts={"a": local_host(tmp_path / "a"), "b": local_host(tmp_path / "b", role="spare")},
        jobs={"j": {"host": "a", "spares": ["b"], **stdlib_job(**over)}},
    )


def controller(inventory: Path, policy: Policy) -> tuple[Controller, asyncio.Task[Any]]:
    """A console (staying after its jobs end, as an operator's does), running."""
    env = {h: dict(EXECUTOR_ENV) for h in ("a", "b")}
    ctl = Controller(load(inventory), policy, executor_env=env)
    return ctl, asyncio.create_task(ctl.run(stay=True))


async def close(ctl: Controller, task: asyncio.Task[Any]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await ctl.close()


async def die(ctl: Controller, task: asyncio.Task[Any]) -> None:
    """The console dies: its tasks end and its lock goes, but no "console stopped" is
    journalled (the next console takes it for a console killed)."""
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    for sup in ctl.jobs.values():
        if sup.link is not None:
            sup.link.close()
    await ctl.replicator.close()
    await ctl.fleet.close()
    ctl.journal.close()
    ctl.lock.release()


def workdir(tmp_path: Path, host: str) -> Path:
    return tmp_path / host / "jobs" / "j"


def executor_events(tmp_path: Path, host: str, kind: str) -> list[dict[str, Any]]:
    """What the executors on ``host`` sent (their own ``events.jsonl``), of one kind."""
    path = workdir(tmp_path, host) / "events.jsonl"
    if not path.exists():
        return []
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [e for e in lines if e.get("kind") == kind]


def last_progress(tmp_path: Path, host: str) -> int:
    """The last step the executors on ``host`` reported done: in a Progress, or as a
    checkpoint saved (a checkpoint at step N means step N was trained)."""
    steps = [e["step"] for e in executor_events(tmp_path, host, "progress")]
    steps += [e["manifest"]["step"] for e in executor_events(tmp_path, host, "checkpoint")]
    return max(steps, default=0)


def manifests(folder: Path) -> set[int]:
    """Steps of the checkpoints (or replicas) whose manifests are in ``folder``."""
    return {json.loads(p.read_text())["step"] for p in folder.glob("step-*.json")}


def written(tmp_path: Path, host: str) -> set[int]:
    return manifests(workdir(tmp_path, host) / "checkpoints")


def replicas(tmp_path: Path, host: str) -> set[int]:
    return manifests(tmp_path / host / "replicas" / "j")


def resumes(tmp_path: Path, host: str) -> list[int]:
    """The step each run on ``host`` resumed from, as its executor sent it."""
    return [e["step"] for e in executor_events(tmp_path, host, "resumed")]


def journal(tmp_path: Path) -> list[Event]:
    return list(read(tmp_path / "state" / "journal.jsonl"))


def journalled_step(tmp_path: Path, host: str) -> int:
    """The last step of ``host``'s run in the journal's (sampled) progress lines."""
    return max(
        (e.data["step"] for e in journal(tmp_path) if e.kind is Kind.PROGRESS and e.host == host),
        default=0,
    )


def report(tmp_path: Path) -> tuple[str, dict[str, Any]]:
    """``hotspare report`` of the state dir: markdown and JSON, checked for what every report
    must be: no ``None`` printed; each incident resolved or saying why not; MTTR present
    exactly when it recovered; its lost steps its last step less the step resumed from."""
    text, doc = io.StringIO(), io.StringIO()
    assert write_report(tmp_path / "state", text) == 0
    assert write_report(tmp_path / "state", doc, as_json=True) == 0
    md, found = text.getvalue(), json.loads(doc.getvalue())
    assert "None" not in md, md
    for i in found["incidents"]:
        assert i["outcome"] in ("recovered", "stopped", "failed", "open"), i
        assert i["resolved"] == (i["outcome"] == "recovered"), i
        assert (i["mttr_s"] is not None) == (i["outcome"] == "recovered"), i
        if i["resumed_step"] is None:
            assert i["lost_steps"] is None and i["outcome"] != "recovered", i
        else:
            assert i["lost_steps"] == i["last_step"] - i["resumed_step"], i
    lost: dict[str, int] = {}
    for i in found["incidents"]:
        lost[i["class"]] = lost.get(i["class"], 0) + (i["lost_steps"] or 0)
    for job in found["jobs"]:
        assert {c: x["steps"] for c, x in job["lost"].items()} == lost, (job, lost)
    return md, found


def the_incident(doc: dict[str, Any]) -> dict[str, Any]:
    (inc,) = doc["incidents"]
    return inc


def assert_lost_from_a(tmp_path: Path, inc: dict[str, Any], b_resumed: int) -> None:
    """The incident's steps: its last step is one a's run reported (no earlier than the
    journal's last sample of it, no later than a's own record), and b resumed from a
    checkpoint a wrote whole and b held a replica of."""
    assert b_resumed == inc["resumed_step"]
    if b_resumed:
        assert b_resumed in written(tmp_path, "a") and b_resumed in replicas(tmp_path, "b")
    assert journalled_step(tmp_path, "a") <= inc["last_step"] <= last_progress(tmp_path, "a")
    # A checkpoint the console heard of counts as a step done. One a wrote as it was killed,
    # whose message died with it, cannot (a fresh-clone run: ckpt 40 on a's disk, its
    # CheckpointSaved never received): a's disk bounds the last step from above only.
    heard = [
        e.data["step"] for e in journal(tmp_path) if e.kind is Kind.CHECKPOINT and e.host == "a"
    ]
    assert inc["last_step"] >= max(heard, default=0), "a checkpoint is done"
    assert inc["lost_steps"] == inc["last_step"] - b_resumed


async def trained_on_b(ctl: Controller) -> None:
    await until(lambda: ctl.jobs["j"].host == "b" and ctl.jobs["j"].step > 0, 60, "j on b")
    await until(lambda: ctl.jobs["j"].incident is None, 60, "the incident recovered")


@pytest.mark.long  # the report's figures without a process: test_breakdown, test_incident_resolve; three real runs stay here
async def test_a_denied_failover_ends_its_incident_and_a_start_later_recovers_it(
    tmp_path: Path,
) -> None:
    """Manual policy, a killed, the failover denied: the incident ends there, stopped by an
    operator, not recovered. The console dies while the job is stopped (no new incident:
    nothing was left running). Started again under the next console and approved, the job
    resumes on b from its newest replica: the same incident recovers, its cause still a's
    loss, its lost steps from a's last reported step back to the checkpoint resumed from."""
    inventory = fleet(tmp_path)
    ctl, task = controller(inventory, Policy.MANUAL)
    await until(lambda: ctl.replicator.replica("j", "b").manifest, 90, "a replica on b")
    ctl.kill_host("a")
    await until(lambda: ctl.jobs["j"].approval is not None, 30, "the failover asked")
    assert ctl.deny("j")
    await until(lambda: ctl.jobs["j"].state is JobState.STOPPED, 30, "j stopped")

    text, doc = report(tmp_path)
    inc = the_incident(doc)
    assert (inc["class"], inc["outcome"], inc["resumed_step"]) == ("host_lost", "stopped", None)
    assert inc["ended"] == "failover denied by an operator"
    assert "no: not recovered: the job was stopped by an operator" in text, text
    assert "not resumed yet" in text, text
    assert doc["jobs"][0]["lost"]["host_lost"] == {"incidents": 1, "steps": 0, "unresumed": 1}

    await die(ctl, task)
    ctl, task = controller(inventory, Policy.MANUAL)
    await until(lambda: ctl.jobs["j"].state is JobState.STOPPED, 30, "j stopped, still")
    assert the_incident(report(tmp_path)[1])["outcome"] == "stopped", "no console_restart one"
    ctl.start_job("j")
    await until(lambda: ctl.jobs["j"].approval is not None, 30, "the failover asked again")
    assert ctl.approve("j")
    await trained_on_b(ctl)
    await close(ctl, task)

    text, doc = report(tmp_path)
    assert "console start" not in text, text
    # a's loss at the start again is said as the start's, not blamed on a console start
    said = [e.msg for e in journal(tmp_path) if e.host == "a" and "host_lost" in e.msg]
    assert said and not [m for m in said if "console start" in m], said
    assert any("cannot start on a" in m for m in said), said
    inc = the_incident(doc)
    assert (inc["class"], inc["outcome"], inc["stopped_once"]) == ("host_lost", "recovered", True)
    (b_resumed,) = resumes(tmp_path, "b")
    assert_lost_from_a(tmp_path, inc, b_resumed)
    assert inc["lost_steps"] > 0 or b_resumed == inc["last_step"]
    assert "recovered, after an operator stopped the job and started it again" in text
    (found,) = incidents(journal(tmp_path))
    parts = found.breakdown()
    assert parts["stopped"] > 0 and sum(parts.values()) == pytest.approx(found.mttr_s)


async def test_an_approved_failover_recovers_with_the_steps_back_to_the_replica(
    tmp_path: Path,
) -> None:
    ctl, task = controller(fleet(tmp_path), Policy.MANUAL)
    await until(lambda: ctl.replicator.replica("j", "b").manifest, 90, "a replica on b")
    ctl.kill_host("a")
    await until(lambda: ctl.jobs["j"].approval is not None, 30, "the failover asked")
    assert ctl.approve("j")
    await trained_on_b(ctl)
    await close(ctl, task)
    text, doc = report(tmp_path)
    inc = the_incident(doc)
    assert (inc["class"], inc["outcome"], inc["stopped_once"]) == ("host_lost", "recovered", False)
    (b_resumed,) = resumes(tmp_path, "b")
    assert_lost_from_a(tmp_path, inc, b_resumed)
    assert "MTTR p50" in text


async def test_a_job_resumed_from_step_0_lost_every_step_it_had_trained(
    tmp_path: Path,
) -> None:
    """No checkpoint before a is lost: b starts from 0, and every step a reported is lost."""
    ctl, task = controller(fleet(tmp_path, checkpoint_every_steps=100_000), Policy.AUTO)
    await until(lambda: ctl.jobs["j"].step >= 20, 90, "j training")
    ctl.kill_host("a")
    await trained_on_b(ctl)
    await close(ctl, task)
    assert written(tmp_path, "a") == set() and replicas(tmp_path, "b") == set()
    text, doc = report(tmp_path)
    inc = the_incident(doc)
    assert resumes(tmp_path, "b") == [0]
    assert_lost_from_a(tmp_path, inc, 0)
    assert inc["lost_steps"] == inc["last_step"] >= 20
    assert f"(last step {inc['last_step']}, resumed at 0)" in text, text


@pytest.mark.long  # the report's figures without a process: test_breakdown, test_incident_resolve; three real runs stay here
async def test_a_stop_and_a_start_lose_nothing_and_open_no_incident(tmp_path: Path) -> None:
    """``s`` checkpoints at the stop; ``g`` resumes from that checkpoint on the same host."""
    ctl, task = controller(fleet(tmp_path), Policy.AUTO)
    await until(lambda: ctl.jobs["j"].step >= 30, 90, "j training")
    ctl.stop_job("j")
    await until(lambda: ctl.jobs["j"].state is JobState.STOPPED, 30, "j stopped")
    stopped_at = last_progress(tmp_path, "a")
    ctl.start_job("j")
    await until(lambda: ctl.jobs["j"].step > stopped_at, 60, "j training again")
    await close(ctl, task)
    first, again = resumes(tmp_path, "a")
    assert first == 0 and again == max(written(tmp_path, "a") & set(range(stopped_at + 1)))
    # the operator's stop; the second run's own stop (its lease lapsing once this console quit
    # and waited for its clean-ups) may be written by now too
    (stop,) = [e for e in executor_events(tmp_path, "a", "stopped") if e["reason"] == "operator"]
    assert again == stop["checkpoint_step"] == stopped_at, (stop, stopped_at)
    text, doc = report(tmp_path)
    assert doc["incidents"] == [] and "No incidents." in text
    assert doc["jobs"][0]["lost"] == {}


async def test_a_drain_moves_the_job_with_no_step_lost(tmp_path: Path) -> None:
    ctl, task = controller(fleet(tmp_path), Policy.AUTO)
    await until(lambda: ctl.replicator.replica("j", "b").manifest, 90, "a replica on b")
    ctl.drain_host("a")
    await trained_on_b(ctl)
    await close(ctl, task)
    _, doc = report(tmp_path)
    inc = the_incident(doc)
    assert (inc["class"], inc["outcome"], inc["lost_steps"]) == ("drain", "recovered", 0)
    (b_resumed,) = resumes(tmp_path, "b")
    (stop,) = executor_events(tmp_path, "a", "stopped")
    assert b_resumed == stop["checkpoint_step"] == max(written(tmp_path, "a"))
    assert b_resumed in replicas(tmp_path, "b")
    assert_lost_from_a(tmp_path, inc, b_resumed)


@pytest.mark.long  # the report's figures without a process: test_breakdown, test_incident_resolve; three real runs stay here
async def test_a_console_restart_during_an_incident_carries_it_on(tmp_path: Path) -> None:
    """The console dies while a failover waits for approval: the next console carries the
    open incident on (no second one), and its approval recovers it."""
    inventory = fleet(tmp_path)
    ctl, task = controller(inventory, Policy.MANUAL)
    await until(lambda: ctl.replicator.replica("j", "b").manifest, 90, "a replica on b")
    ctl.kill_host("a")
    await until(lambda: ctl.jobs["j"].approval is not None, 30, "the failover asked")
    await die(ctl, task)
    ctl, task = controller(inventory, Policy.MANUAL)
    await until(lambda: ctl.jobs["j"].approval is not None, 30, "asked again, after the restart")
    assert ctl.approve("j")
    await trained_on_b(ctl)
    await close(ctl, task)
    _, doc = report(tmp_path)
    inc = the_incident(doc)
    assert (inc["class"], inc["outcome"]) == ("host_lost", "recovered"), inc
    (b_resumed,) = resumes(tmp_path, "b")
    assert_lost_from_a(tmp_path, inc, b_resumed)
    phases = [e.data["phase"] for e in journal(tmp_path) if e.kind is Kind.INCIDENT]
    assert "console_restart" in phases, phases


@pytest.mark.long  # the report's figures without a process: test_breakdown, test_incident_resolve; three real runs stay here
async def test_a_host_lost_while_its_job_stood_stopped_is_recovered_from_the_stop(
    tmp_path: Path,
) -> None:
    """``s``, then a dies while the job stands stopped, then ``g``: the job cannot go back
    to a. It starts on b from the replica of the stop's checkpoint (the stop's checkpoint
    reached b before the start, or it resumes from the newest one that did), and the report
    counts what it lost from the step it stopped at, not from a step trained after."""
    ctl, task = controller(fleet(tmp_path), Policy.AUTO)
    await until(lambda: ctl.replicator.replica("j", "b").manifest, 90, "a replica on b")
    ctl.stop_job("j")
    await until(lambda: ctl.jobs["j"].state is JobState.STOPPED, 30, "j stopped")
    (stop,) = executor_events(tmp_path, "a", "stopped")
    await until(
        lambda: stop["checkpoint_step"] in replicas(tmp_path, "b"), 30, "the stop's replica on b"
    )
    ctl.kill_host("a")
    ctl.start_job("j")
    await trained_on_b(ctl)
    await close(ctl, task)
    (b_resumed,) = resumes(tmp_path, "b")
    assert b_resumed == stop["checkpoint_step"], (b_resumed, stop)
    _, doc = report(tmp_path)
    assert len(doc["incidents"]) <= 1, doc["incidents"]
    for inc in doc["incidents"]:  # a's loss found at the start: nothing trained was lost
        assert inc["outcome"] == "recovered" and inc["lost_steps"] == 0, inc
        assert inc["last_step"] == stop["step"], (inc, stop)
    assert doc["jobs"][0]["lost"].get("host_lost", {"steps": 0})["steps"] == 0
