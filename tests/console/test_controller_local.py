"""The fleet controller on local demo hosts: real executors, real torch, real files and signals."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
from chaos.procs import Sampler
from support.fleetbed import (
    EXECUTOR_ENV,
    baseline_params,
    baseline_sha,
    checkpoint_params,
    executor_tree,
    job_table,
    kill_caught_up,
    local_host,
    run_until,
    set_console,
    stdlib_job,
    until,
    write_inventory,
)
from support.helpers import PLAIN_SCRIPT, plain_command
from support.lease_bounds import LeaseBounds

from console.controller import Controller
from console.inventory import load
from console.records.incidents import incidents
from console.records.journal import Kind, read
from console.states import HostState, JobState
from console.supervise.member import Member
from console.supervise.messages import JobMessages
from console.supervise.outcome import Outcome
from console.supervise.policy import Policy
from protocol.messages import CheckpointSaved, ExecutorMessage, Fault


@pytest.fixture
def fleet(tmp_path: Path, request: pytest.FixtureRequest) -> Path:
    """Job j on a, spare b (and c, in another region). The command kind running a stdlib
    script, whose subject here is the console; ``torch`` (indirect parametrization): the torch
    kind, for a test that compares the checkpoint's parameters."""
    job = job_table() if getattr(request, "param", None) == "torch" else stdlib_job()
    return write_inventory(
        tmp_path / "inventory.toml",
        hosts={
            "a": local_host(tmp_path / "a"),
            "b": local_host(tmp_path / "b", role="spare"),
            "c": local_host(tmp_path / "c", region="r2", role="spare"),
        },
        jobs={"j": {"host": "a", "spares": ["b"], **job}},
    )


@pytest.fixture
def baseline(fleet: Path, tmp_path: Path) -> str:
    return baseline_sha(fleet, "j", tmp_path / "baseline")


def controller(inventory: Path, policy: Policy = Policy.AUTO) -> Controller:
    env = {h: dict(EXECUTOR_ENV) for h in ("a", "b", "c")}
    return Controller(load(inventory), policy, executor_env=env)


def executor_pid(root: Path) -> int:
    return int((root / "jobs" / "j" / "executor.pid").read_text())


def journal(inventory: Path) -> list:  # type: ignore[type-arg]
    return list(read(inventory.parent / "state" / "journal.jsonl"))


@pytest.mark.long  # the suite SIGKILLs the executor and sees it restarted in place (test_report_summary, test_tensorboard_export), bit-exact (chaos's corrupt_checkpoint, test_chaos)
async def test_sigkill_of_the_executor_restarts_it_in_place(
    fleet: Path, baseline: str, tmp_path: Path
) -> None:
    ctl = controller(fleet)
    sup = ctl.jobs["j"]
    task = await run_until(ctl, lambda: sup.step >= 60, 90, "step 60")
    os.kill(executor_pid(tmp_path / "a"), signal.SIGKILL)
    await asyncio.wait_for(task, 120)
    await ctl.close()
    assert sup.state is JobState.FINISHED
    assert sup.sha256 == baseline
    assert sup.host == "a", "restarted in place"
    assert ctl.store.job("j").restarts == 0, "checkpoints after the restart reset the count"
    assert any("restart count starts again" in e.msg for e in journal(fleet))
    (inc,) = incidents(journal(fleet))
    assert inc.fault_class == "executor_crash"
    assert inc.resolved
    assert inc.lost_steps is not None
    assert inc.lost_steps <= 2 * 20, (
        "one interval, plus a checkpoint that may be mid-write at the kill"
    )


@pytest.mark.long  # the suite proves a lost host's failover past its lease bound (test_group_local's killed member; test_elastic_ssh's cut one, over sshd)
@pytest.mark.parametrize("fleet", ["torch"], indirect=True)
async def test_a_dead_host_fails_over_to_its_spare(
    fleet: Path, baseline: str, tmp_path: Path
) -> None:
    # a lease longer than detection plus a cold start of b (~4 s here): a console that did not
    # wait it out would be seen training b before the bound
    ctl = controller(set_console(fleet, lease_s=6.0))
    sup = ctl.jobs["j"]
    a_dir, b_dir = (tmp_path / h / "jobs" / "j" for h in "ab")
    sampler = Sampler({"j": [a_dir, b_dir]}).start()
    bounds = LeaseBounds(fleet.parent / "state" / "state.json").start()
    task = await run_until(ctl, lambda: sup.step >= 60, 90, "step 60")
    epoch = sup.epoch
    # a stopped at a moment b's replica is within one interval of a's newest checkpoint
    kill = functools.partial(ctl.kill_host, "a")
    replica_at_kill, lost_at = await kill_caught_up(
        ctl, lambda: executor_tree(a_dir), kill, a_dir, 20
    )
    await until(lambda: sampler.windows(b_dir) or task.done(), 60, "b training (/proc)")
    bounds.stop()
    sampler.stop()
    await asyncio.wait_for(task, 120)
    await ctl.close()
    assert sup.state is JobState.FINISHED
    assert sup.host == "b"
    assert sup.sha256 == baseline
    final = checkpoint_params(tmp_path / "b" / "jobs" / "j")  # hashed here, from the bytes
    assert final == baseline_params(fleet, "j", tmp_path / "baseline")
    assert final != checkpoint_params(tmp_path / "a" / "jobs" / "j"), "a's older params differ"
    assert ctl.fleet.hosts["a"].state is HostState.DOWN
    (inc,) = incidents(journal(fleet))
    assert inc.fault_class == "host_lost"
    phases = {"detected", "decided", "transfer_done", "loaded", "first_step"}
    standby_first = [  # a warm standby (HOTSPARE_TEST_WARM_STANDBY=1), started on b before the kill
        e
        for e in journal(fleet)
        if e.kind is Kind.EXECUTOR and e.host == "b" and "started on b" in e.msg and e.t < lost_at
    ]
    # an executor started for the failover is a phase of it; one started before the fault is
    # not, even if it was still readying when the host died (a fresh-clone run: b's standby
    # started 3.5 s before the kill and was ready 0.05 s after it; the failover took it)
    assert set(inc.times) == (phases if standby_first else phases | {"executor_up"}), inc.times
    assert inc.lost_steps is not None
    assert inc.lost_steps <= 2 * 20, "one interval, plus a checkpoint still on its way to the spare"
    assert inc.resumed_step is not None
    assert inc.resumed_step >= replica_at_kill, "resumed from the newest verified replica"
    # from /proc and state.json, not the journal: b first trained past the end of a's newest
    # lease (the bound persisted by the kill, less its lead) plus clock_skew_s
    console = ctl.inv.console
    granted = bounds.granted_end("j", epoch, console.lease_s, by=lost_at)
    assert granted is not None and sampler.windows(a_dir), "a was seen training before the kill"
    b_first = sampler.windows(b_dir)[0]
    assert b_first.t1 > granted + console.clock_skew_s, (
        f"b trained {granted + console.clock_skew_s - b_first.t1:.2f}s before a's lease ended"
    )
    assert not sampler.overlaps, "a and b never trained at once"


def moved_without_loss(root: Path) -> tuple[int, int]:
    """(the step a's executor stopped at with its checkpoint, the step b's resumed from), from
    the executors' own events.jsonl: a move loses no step when the two are equal."""

    def events(host: str) -> list[dict[str, object]]:
        path = root / host / "jobs" / "j" / "events.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    # the first: a warm standby a may keep for the job afterwards (a, preempted, is a spare
    # again) writes an idle 'stopped' of its own when the job ends
    stopped = next(e for e in events("a") if e["kind"] == "stopped")
    assert stopped["checkpoint_step"] == stopped["step"], f"a stopped unsaved: {stopped}"
    resumed = next(e for e in events("b") if e["kind"] == "resumed")
    return int(stopped["step"]), int(resumed["step"])  # type: ignore[call-overload]


@pytest.mark.long  # the suite drains a host with a GPU FAIL (tests/ui/test_gpu_fail_recipe.py) and in test_report_adds_up
async def test_draining_a_host_migrates_with_zero_lost_steps(
    fleet: Path, baseline: str, tmp_path: Path
) -> None:
    ctl = controller(fleet)
    sup = ctl.jobs["j"]
    task = await run_until(ctl, lambda: sup.step >= 50, 90, "step 50")
    ctl.drain_host("a")
    await asyncio.wait_for(task, 120)
    await ctl.close()
    assert sup.sha256 == baseline
    assert sup.host == "b"
    assert ctl.fleet.hosts["a"].state is HostState.DRAINED
    (inc,) = incidents(journal(fleet))
    assert inc.planned
    assert inc.lost_steps == 0
    stopped, resumed = moved_without_loss(tmp_path)
    assert stopped == resumed > 0, "b resumed at the very step a stopped at"


async def test_a_host_drained_while_its_job_deploys_there_is_left_once_the_job_trains(
    fleet: Path, baseline: str, tmp_path: Path
) -> None:
    """An operator drains a while j is still being deployed there. It was called drained at
    once ("no jobs to move") and j trained its whole run on it: the drain now waits for j,
    which moves once it trains, with no step lost, and a is drained only once j has left it."""
    ctl = controller(fleet)
    sup = ctl.jobs["j"]
    task = await run_until(ctl, lambda: sup.state is JobState.DEPLOYING, 60, "deploying")
    ctl.drain_host("a")
    assert ctl.fleet.hosts["a"].state is HostState.DRAINING, "j is on its way there"
    await asyncio.wait_for(task, 120)
    await ctl.close()
    assert sup.sha256 == baseline
    assert sup.host == "b"
    assert ctl.fleet.hosts["a"].state is HostState.DRAINED
    stopped, resumed = moved_without_loss(tmp_path)
    assert stopped == resumed > 0, "b resumed at the very step a stopped at"
    kept = [e.data for e in journal(fleet) if e.kind is Kind.ACTION and e.data.get("kept")]
    assert kept, "the move was kept until j trained"


async def test_a_job_that_dies_during_its_hosts_drain_leaves_it_drained(
    fleet: Path, baseline: str, tmp_path: Path
) -> None:
    """j's executor is SIGKILLed as its host is drained (before its drain's checkpoint, or
    while its restart is decided: either order). j fails over to b and ends bit-exact; a is
    drained, so ``undrain`` takes it back. a stayed draining for good, and undrain refused it."""
    ctl = controller(fleet)
    sup = ctl.jobs["j"]
    task = await run_until(ctl, lambda: sup.step >= 30, 90, "step 30")
    os.kill(executor_pid(tmp_path / "a"), signal.SIGKILL)
    ctl.drain_host("a")
    await asyncio.wait_for(task, 120)
    assert sup.sha256 == baseline
    assert sup.host == "b"
    assert ctl.fleet.hosts["a"].state is HostState.DRAINED
    ctl.undrain("a")
    assert ctl.fleet.hosts["a"].state is HostState.UP
    await ctl.close()


@pytest.mark.long  # a kept move's decision: test_orders (no process)
async def test_a_fail_over_ordered_while_the_job_restarts_is_made_once_it_trains(
    fleet: Path, baseline: str, tmp_path: Path
) -> None:
    """'f' pressed while the job restarts after its executor died (a loaded run pressed it
    then, and the move was dropped as not delivered): kept, and made once the job trains
    again, with no step lost to the move."""
    ctl = controller(fleet)
    sup = ctl.jobs["j"]
    task = await run_until(ctl, lambda: sup.step >= 50, 90, "step 50")
    os.kill(executor_pid(tmp_path / "a"), signal.SIGKILL)
    await until(
        lambda: sup.state in (JobState.RESTARTING, JobState.DEPLOYING) or task.done(),
        30,
        "the restart",
    )
    assert sup.state in (JobState.RESTARTING, JobState.DEPLOYING), sup.state
    ctl.fail_over("j", "b")
    await asyncio.wait_for(task, 120)
    await ctl.close()
    assert sup.state is JobState.FINISHED
    assert sup.sha256 == baseline
    assert sup.host == "b"
    events = journal(fleet)
    (kept,) = [e for e in events if e.kind is Kind.ACTION and e.data.get("kept")]
    assert kept.data["target"] == "b"
    crash, move = incidents(events)
    assert crash.fault_class == "executor_crash" and crash.resolved
    assert move.planned and move.lost_steps == 0
    assert move.fault_at > kept.t, "the move came after it was kept"


@pytest.mark.long  # the suite proves a preemption's zero lost steps with its checkpoint dropped (in this file)
async def test_sigterm_to_the_executor_migrates_with_zero_lost_steps(
    fleet: Path, baseline: str, tmp_path: Path
) -> None:
    ctl = controller(fleet)
    sup = ctl.jobs["j"]
    task = await run_until(ctl, lambda: sup.step >= 50, 90, "step 50")
    os.kill(executor_pid(tmp_path / "a"), signal.SIGTERM)
    await asyncio.wait_for(task, 120)
    await ctl.close()
    assert sup.sha256 == baseline
    assert sup.host == "b"
    (inc,) = incidents(journal(fleet))
    assert inc.fault_class == "preemption"
    assert inc.lost_steps == 0
    stopped, resumed = moved_without_loss(tmp_path)
    assert stopped == resumed > 0, "b resumed at the very step a stopped at"


@pytest.mark.long  # the suite proves the decision without processes (test_what_next) and a planned stop's zero lost steps (the preemption below)
async def test_sigint_to_the_executor_restarts_in_place_with_zero_lost_steps(
    fleet: Path, baseline: str, tmp_path: Path
) -> None:
    """A Ctrl-C of the executor (SIGINT) checkpoints at the step and stops; it says nothing of
    the host, so the job restarts there, for free (a single host's job moved to its spare
    before the one recovery decision, where a group restarted in place)."""
    ctl = controller(fleet)
    sup = ctl.jobs["j"]
    task = await run_until(ctl, lambda: sup.step >= 50, 90, "step 50")
    os.kill(executor_pid(tmp_path / "a"), signal.SIGINT)
    await asyncio.wait_for(task, 120)
    await ctl.close()
    assert sup.sha256 == baseline
    assert sup.host == "a"
    assert ctl.store.job("j").restarts == 0, "a planned stop takes no restart"
    (inc,) = incidents(journal(fleet))
    assert inc.planned and inc.lost_steps == 0 and inc.resolved

    def said(host: str) -> list[dict[str, Any]]:
        path = tmp_path / host / "jobs" / "j" / "events.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        return [json.loads(line) for line in lines]

    assert not [e for e in said("b") if e["kind"] in ("resumed", "progress")], (
        "b (its warm standby at most) trained nothing"
    )
    events = said("a")
    stopped = next(e for e in events if e["kind"] == "stopped")
    assert stopped["reason"] == "interrupted" and stopped["checkpoint_step"] == stopped["step"]
    resumed = [e["step"] for e in events if e["kind"] == "resumed"]
    assert resumed == [0, stopped["step"]], "its start, then the very step it stopped at"


@pytest.mark.parametrize(
    "lost",
    [
        "checkpoint_dropped",
        # the suite proves the harder case: its checkpoint read back though its message was dropped
        pytest.param("nothing_read_after_the_fault", marks=pytest.mark.long),
    ],
)
async def test_a_preemption_whose_checkpoint_the_link_never_delivered_still_loses_no_step(
    fleet: Path, baseline: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lost: str
) -> None:
    """The checkpoint at the stop is read back from a's events.jsonl when its CheckpointSaved
    never came over the link: that message lost on its own (the Stopped still read), or the
    link closed by the console as the preemption's Fault was read and nothing read after it
    (CI at 059ac18: b resumed from step 80, 11 steps lost, as the link closed before the last
    messages were read)."""
    real = JobMessages.on_message  # the one dispatcher of what every job's executors say
    terminated = asyncio.Event()
    dropped: list[str] = []

    def heard(self: JobMessages, m: Member, msg: ExecutorMessage) -> Outcome | None:
        if m.host != "a" or m.link is None or not terminated.is_set():
            return real(self, m, msg)
        if lost == "checkpoint_dropped":
            if isinstance(msg, CheckpointSaved) and not dropped:
                dropped.append(type(msg).__name__)
                return None
        elif dropped:
            dropped.append(type(msg).__name__)
            return None
        elif isinstance(msg, Fault):
            dropped.append("the link")
            end = real(self, m, msg)
            m.link.close()
            return end
        return real(self, m, msg)

    monkeypatch.setattr(JobMessages, "on_message", heard)
    ctl = controller(fleet)
    sup = ctl.jobs["j"]
    task = await run_until(ctl, lambda: sup.step >= 50, 90, "step 50")
    terminated.set()
    os.kill(executor_pid(tmp_path / "a"), signal.SIGTERM)
    await asyncio.wait_for(task, 120)
    await ctl.close()
    assert dropped, "nothing was lost: the test did not test"
    assert sup.sha256 == baseline
    assert sup.host == "b"
    stopped, resumed = moved_without_loss(tmp_path)
    assert stopped == resumed > 0, "b resumed at the very step a stopped at"
    (inc,) = incidents(journal(fleet))
    assert inc.fault_class == "preemption" and inc.lost_steps == 0


@pytest.mark.long  # the suite proves it in test_controller_stay, test_service and tests/ui/test_views.py
async def test_killing_the_console_leaves_training_going_and_a_new_one_reattaches(
    tmp_path: Path,
) -> None:
    """The executor trains on under its last lease, and the next console started within it
    reattaches. A lease longer than the tests' 3 s: the first console's close waits for its
    clean-ups (a warm standby still starting is stopped), and took 5 s once (scripts/test-long,
    loaded), past the lease, so the executor had stopped itself when the next one came. And a
    job long enough to still train then: at 400 steps a close of 6 s (scripts/test-long at
    acaa030) let it finish with no console, and the next one rightly read the finish back
    instead of reattaching."""
    fleet = write_inventory(
        tmp_path / "inventory.toml",
        hosts={"a": local_host(tmp_path / "a"), "b": local_host(tmp_path / "b", role="spare")},
        jobs={"j": {"host": "a", "spares": ["b"], **job_table(steps=2000)}},
        lease_s=15.0,
    )
    baseline = baseline_sha(fleet, "j", tmp_path / "baseline")
    ctl = controller(fleet)
    sup = ctl.jobs["j"]
    task = await run_until(ctl, lambda: sup.step >= 40, 90, "step 40")
    pid = executor_pid(tmp_path / "a")
    task.cancel()  # the console dies; nothing tells the executor to stop
    await asyncio.gather(task, return_exceptions=True)
    await ctl.close()
    step_then = sup.step
    again = controller(fleet)
    sup2 = again.jobs["j"]
    await asyncio.wait_for(again.run(), 120)
    await again.close()
    assert sup2.sha256 == baseline
    assert executor_pid_from_journal(fleet) == {pid}, "the same executor ran throughout"
    assert sup2.step > step_then
    assert any(e.kind is Kind.EXECUTOR and "reattached" in e.msg for e in journal(fleet))


def executor_pid_from_journal(inventory: Path, host: str = "a") -> set[int]:
    """The executors the journal says ran on ``host`` (b's warm standby is another host's)."""
    return {
        e.data["pid"]
        for e in journal(inventory)
        if e.kind is Kind.EXECUTOR and "pid" in e.data and e.host == host
    }


@pytest.mark.long  # the suite proves a host added later taken by a job with no spare (test_spare_keeper)
async def test_with_no_spare_left_the_job_waits_and_alerts_then_resumes_when_a_host_is_added(
    tmp_path: Path,
) -> None:
    inv = write_inventory(
        tmp_path / "inventory.toml",
        hosts={"a": local_host(tmp_path / "a")},
        jobs={"j": {"host": "a", **job_table(steps=300)}},
    )
    ctl = controller(inv)
    sup = ctl.jobs["j"]
    task = await run_until(ctl, lambda: sup.step >= 40, 90, "step 40")
    ctl.kill_host("a")
    await until(lambda: sup.state is JobState.PENDING, 30, "the job to wait")
    assert any(e.kind is Kind.ALERT and "no spare left" in e.msg for e in journal(inv))
    ctl.add_host("d", local_host(tmp_path / "d"))
    ctl.executor_env["d"] = dict(EXECUTOR_ENV)
    await asyncio.wait_for(task, 120)
    await ctl.close()
    assert sup.state is JobState.FINISHED
    assert sup.host == "d"
    assert "[hosts.d]" in inv.read_text()


@pytest.mark.long
async def test_manual_policy_waits_for_approval(fleet: Path, baseline: str) -> None:
    ctl = controller(fleet, Policy.MANUAL)
    sup = ctl.jobs["j"]
    task = await run_until(
        ctl,
        lambda: sup.step >= 40 and ctl.replicator.replica("j", "b").manifest,
        90,
        "step 40 and a replica",
    )
    ctl.kill_host("a")
    await until(lambda: sup.approval is not None, 30, "an approval request")
    assert sup.state is JobState.PENDING
    assert ctl.approve("j")
    await asyncio.wait_for(task, 120)
    await ctl.close()
    assert sup.sha256 == baseline


@pytest.mark.long  # the suite drains a host on a GPU FAIL and moves its job in the console (tests/ui/test_gpu_fail_recipe.py); a drain loses no step (test_report_adds_up)
async def test_a_gpu_fail_drains_the_host_and_moves_the_job(
    fleet: Path, baseline: str, tmp_path: Path
) -> None:
    from executors.testing.gpu_fake import write_state

    nvml = tmp_path / "nvml-a.json"
    healthy = {"devices": [{"name": "Fake H100", "temp_c": 50}]}
    write_state(nvml, healthy)
    ctl = controller(fleet)
    ctl.executor_env["a"]["HOTSPARE_FAKE_NVML"] = str(nvml)
    sup = ctl.jobs["j"]
    task = await run_until(ctl, lambda: sup.step >= 40, 90, "step 40")
    assert ctl.fleet.hosts["a"].health[-1].gpu_status.startswith("ok"), "the fake GPU is read"
    write_state(
        nvml, {"devices": [{"name": "Fake H100", "temp_c": 50, "ecc_uncorrected": 2, "xids": [79]}]}
    )
    await asyncio.wait_for(task, 120)
    await ctl.close()
    assert sup.sha256 == baseline
    assert sup.host == "b"
    assert ctl.fleet.hosts["a"].state is HostState.DRAINED
    (inc,) = incidents(journal(fleet))
    assert inc.fault_class == "gpu_fail"
    assert inc.lost_steps == 0
    fails = [e for e in journal(fleet) if e.kind is Kind.HEALTH and e.data["severity"] == "fail"]
    assert {e.data["rule"] for e in fails} >= {"ecc_dbe", "xid_79"}


@pytest.mark.long
async def test_a_lasting_gpu_warn_under_auto_migrates_with_zero_lost_steps(tmp_path: Path) -> None:
    from executors.testing.gpu_fake import write_state

    fleet = write_inventory(
        tmp_path / "inventory.toml",
        hosts={"a": local_host(tmp_path / "a"), "b": local_host(tmp_path / "b", role="spare")},
        jobs={"j": {"host": "a", "spares": ["b"], **job_table(steps=1500)}},
    )
    baseline = baseline_sha(fleet, "j", tmp_path / "baseline")
    nvml = tmp_path / "nvml-a.json"
    write_state(nvml, {"devices": [{"name": "Fake H100", "temp_c": 50}]})
    ctl = controller(fleet)
    ctl.executor_env["a"]["HOTSPARE_FAKE_NVML"] = str(nvml)
    sup = ctl.jobs["j"]
    task = await run_until(ctl, lambda: sup.step >= 40, 90, "step 40")
    write_state(
        nvml, {"devices": [{"name": "Fake H100", "temp_c": 91, "throttle": ["hw_thermal"]}]}
    )
    await asyncio.wait_for(task, 120)
    await ctl.close()
    assert sup.sha256 == baseline
    assert sup.host == "b"
    (inc,) = incidents(journal(fleet))
    assert inc.fault_class == "migrate"
    assert inc.lost_steps == 0
    warns = [e for e in journal(fleet) if e.kind is Kind.HEALTH and e.data["severity"] == "warn"]
    assert {e.data["rule"] for e in warns} == {"throttle", "temperature"}


async def test_by_default_a_warm_standby_takes_over_without_a_new_executor(tmp_path: Path) -> None:
    fleet = write_inventory(
        tmp_path / "inventory.toml",
        hosts={"a": local_host(tmp_path / "a"), "b": local_host(tmp_path / "b", role="spare")},
        jobs={
            "j": {"host": "a", "spares": ["b"], **job_table(warm_standby=None)}
        },  # the default: on
    )
    baseline = baseline_sha(fleet, "j", tmp_path / "baseline")
    ctl = controller(fleet)
    sup = ctl.jobs["j"]
    task = await run_until(ctl, lambda: sup.step >= 60 and sup.standby, 90, "step 60, a standby")
    standby_pid = sup.standby.link.hello.pid
    await until(lambda: ctl.fleet.hosts["b"].health, 10, "the standby to report the spare's health")
    standby_events = tmp_path / "b" / "jobs" / "j" / "events.jsonl"
    kinds = [json.loads(x).get("kind") for x in standby_events.read_text().splitlines()]
    assert not {"progress", "resumed", "checkpoint"} & set(kinds), "the standby trained nothing"
    assert ctl.fleet.hosts["b"].job is None, "a standby does not make b the job's host"
    # a stopped at a moment b's replica is within one interval of a's newest checkpoint
    a_dir, kill = tmp_path / "a" / "jobs" / "j", functools.partial(ctl.kill_host, "a")
    replica_at_kill, _ = await kill_caught_up(ctl, lambda: executor_tree(a_dir), kill, a_dir, 20)
    await asyncio.wait_for(task, 120)
    await ctl.close()
    assert sup.sha256 == baseline
    assert sup.host == "b"
    started_on_b = [
        e.data["pid"]
        for e in journal(fleet)
        if e.kind is Kind.EXECUTOR and e.host == "b" and "started" in e.msg
    ]
    assert started_on_b == [standby_pid], "the standby itself took over"
    (inc,) = incidents(journal(fleet))
    assert inc.lost_steps is not None
    assert inc.lost_steps <= 2 * 20, "one interval, plus a checkpoint still on its way to the spare"
    assert inc.resumed_step is not None
    assert inc.resumed_step >= replica_at_kill, "resumed from the newest verified replica"


@pytest.mark.long
async def test_a_plain_training_script_fails_over_like_any_job(tmp_path: Path) -> None:
    """The `command` kind: a script that knows nothing of hotspare, its host killed midway."""
    import subprocess
    import sys

    script = PLAIN_SCRIPT
    command = plain_command(step_s=0.02)
    fleet = write_inventory(
        tmp_path / "inventory.toml",
        hosts={"a": local_host(tmp_path / "a"), "b": local_host(tmp_path / "b", role="spare")},
        jobs={
            "p": {
                "host": "a",
                "spares": ["b"],
                "executor": "command",
                "steps": 150,
                "command": command,
            }
        },
    )
    ref = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, str(script), "--checkpoint-dir", str(tmp_path / "ref"), "--steps", "150"],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        timeout=120,
    )
    reference = ref.stdout.strip().splitlines()[-1].split()[-1]
    ctl = Controller(load(fleet), Policy.AUTO)
    sup = ctl.jobs["p"]
    task = await run_until(
        ctl,
        lambda: sup.step >= 45 and ctl.replicator.replica("p", "b").manifest,
        90,
        "step 45 and a replica on b",
    )
    ctl.kill_host("a")
    await asyncio.wait_for(task, 120)
    await ctl.close()
    assert sup.state is JobState.FINISHED
    assert sup.host == "b"
    assert sup.sha256 == reference, "the script's final parameters equal an uninterrupted run's"
    (inc,) = incidents(journal(fleet))
    assert inc.fault_class == "host_lost"
    assert inc.resumed_step is not None
    assert inc.resumed_step >= 40


async def test_an_idle_executor_left_on_the_host_is_retired_not_adopted(
    fleet: Path, baseline: str, tmp_path: Path
) -> None:
    """Say a console died between starting an executor and telling it Start: the next one stops it."""
    import subprocess
    import sys

    from support.helpers import REPO, env_with

    from console.records.state_store import StateStore
    from executors import exitcodes

    work = tmp_path / "a" / "jobs" / "j"
    idle = subprocess.Popen(  # noqa: ASYNC220 - started once, reaped below in a thread
        [sys.executable, "-m", "executors.cli", "serve", "--workdir", str(work)],
        env=env_with(),
        cwd=REPO,
    )
    await until(lambda: (work / "executor.sock").exists(), 60, "the idle executor's socket")
    store = StateStore(load(fleet).state_dir)
    store.job("j").host, store.job("j").epoch = "a", 1
    store.save()
    ctl = controller(fleet)
    await asyncio.wait_for(ctl.run(), 120)
    await ctl.close()
    assert await asyncio.to_thread(idle.wait, 30) == exitcodes.STOPPED
    assert ctl.jobs["j"].sha256 == baseline, [e.msg for e in journal(fleet)]  # once in CI: None
    assert not any("reattached" in e.msg for e in journal(fleet))


@pytest.mark.long  # the suite shows the lease wait in the real console (tests/ui/test_tmux.py)
async def test_while_the_lease_runs_out_the_jobs_view_says_so_and_shows_no_rate(
    fleet: Path, tmp_path: Path
) -> None:
    from console.ui.view import job_rows

    ctl = controller(fleet)
    sup = ctl.jobs["j"]
    task = await run_until(ctl, lambda: sup.step >= 40, 90, "step 40")
    assert job_rows(ctl)["j"][7] != "-", "a running job shows its rate"
    ctl.kill_host("a")
    await until(lambda: sup.state is JobState.UNREACHABLE or task.done(), 30, "unreachable")
    row = job_rows(ctl)["j"]
    first = float(row[2].removeprefix("waiting out lease on a: ").removesuffix(" s left"))
    assert 0 <= first <= ctl.inv.console.lease_s
    assert row[7] == "-", "no steps/s shown as current while nothing is heard"
    await until(
        lambda: sup.state is not JobState.UNREACHABLE or sup.lease.left() < first - 1,
        30,
        "a second of the lease to pass",
    )
    if sup.state is JobState.UNREACHABLE:
        later = job_rows(ctl)["j"][2]
        assert later != row[2], "the countdown is live, not the moment it was noted"
    await asyncio.wait_for(task, 120)
    await ctl.close()
    moves = [e.data["to"] for e in journal(fleet) if e.kind is Kind.JOB_STATE]
    assert moves[moves.index("unreachable") + 1] == "failing_over", moves
    (noted,) = [
        e for e in journal(fleet) if e.kind is Kind.JOB_STATE and e.data["to"] == "unreachable"
    ]
    assert "waiting out the lease on a" in noted.msg
