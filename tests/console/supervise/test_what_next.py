"""The one recovery decision of every job (``console.supervise.what_next``): what a run's ends ask
for, one host's or a group's, with no process started. The guarantees behind each act are
proven on real processes elsewhere (restart in place: test_controller; failover: the chaos
seed; a group's replacement and shrink: test_group_*); these pin the decision itself, where
the two kinds had drifted."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
from support.jobbed import Calls, recovered, running, services

from console.fleet.hosts import Fleet
from console.records.incidents import incidents
from console.records.journal import read
from console.states import FailureKind, HostState, JobState
from console.supervise.live import LiveJob
from console.supervise.member import Member
from console.supervise.outcome import Exit, Outcome, from_events_tail, run_end
from console.supervise.services import JobServices
from console.supervise.supervisor import Supervisor
from console.supervise.what_next import Act, Next, budgeted, unfit, what_next
from protocol.faults import FaultKind
from protocol.messages import Fault, Progress, Resumed, RunEnded

FIN = Outcome(Exit.FINISHED, "finished", 100, sha256="ab")
CRASH = Outcome(Exit.CRASHED, "crashed: boom", 7)
RUN_CRASH = Outcome(Exit.RUN_CRASHED, "its collective failed", 7)
HUNG = Outcome(Exit.HUNG, "hang", 7)
LEASE = Outcome(Exit.LEASE_LOST, "stopped: lease_lost", 7)
LOST = Outcome(Exit.HOST_LOST, "unreachable past its lease")
CONFIG = Outcome(Exit.CONFIG, "no module named trainz")
STOPPED = Outcome(Exit.STOPPED, "stopped: operator", 7, reason="operator")
DRAINED = Outcome(Exit.PLANNED, "stopped for drain", 7, reason="drain")
PREEMPTED = Outcome(Exit.PLANNED, "stopped for preempted", 7, reason="preempted")
INTERRUPTED = Outcome(Exit.PLANNED, "stopped for interrupted", 7, reason="interrupted")
PEER = Outcome(Exit.STOPPED, "stopped: peer_stopped", 7, reason="peer_stopped")
REFUSED = Outcome(Exit.RESUME_FAILED, "resume_failed: cannot resume from the committed step 40")


def fit(n: int) -> list[str | None]:
    return [None] * n


@pytest.mark.parametrize(
    ("ends", "first", "stop", "unfit_", "want"),
    [
        # every member finished, and only then
        ([FIN], 0, False, fit(1), Next(Act.FINISH, 0)),
        ([FIN, FIN, FIN], 1, False, fit(3), Next(Act.FINISH, 1)),
        ([FIN, CRASH], 1, False, fit(2), Next(Act.RESTART, 1)),
        # a bad configuration fails fast, whichever member says so, before a stop or a loss
        ([CONFIG], 0, True, ["it was lost"], Next(Act.CONFIG, 0, why=CONFIG.why)),
        ([RUN_CRASH, CONFIG], 0, False, fit(2), Next(Act.CONFIG, 1, why=CONFIG.why)),
        # an operator's stop wins over any other end; a Stopped not asked for stops too
        ([CRASH], 0, True, fit(1), Next(Act.STOP, 0, why=CRASH.why)),
        ([LOST, RUN_CRASH], 0, True, ["it was lost", None], Next(Act.STOP, 0, why=LOST.why)),
        ([STOPPED], 0, False, fit(1), Next(Act.STOP, 0, why=STOPPED.why)),
        ([STOPPED, RUN_CRASH], 0, False, fit(2), Next(Act.STOP, 0, why=STOPPED.why)),
        # a member whose end stopped the others' runs is what decides, not the others' Stopped
        ([RUN_CRASH, STOPPED], 0, False, fit(2), Next(Act.RESTART, 0)),
        # a member that stopped because its group agreed to is never what ended the run, even
        # when its Stopped was read first (found in the merge: it failed the job as stopped)
        ([PEER, CRASH], 0, False, fit(2), Next(Act.RESTART, 1)),
        ([PEER, LEASE], 0, False, fit(2), Next(Act.RESTART, 1)),
        (
            [PEER, DRAINED, PEER],
            2,
            False,
            [None, "it is draining", None],
            Next(Act.REPLACE, 1, (1,), planned=True, why="it is draining"),
        ),
        ([PEER, STOPPED], 0, False, fit(2), Next(Act.STOP, 1, why=STOPPED.why)),
        ([PEER, PEER], 0, False, fit(2), Next(Act.RESTART, 0)),
        # crashes, hangs and lapsed leases on fit hosts restart in place
        ([CRASH], 0, False, fit(1), Next(Act.RESTART, 0)),
        ([HUNG], 0, False, fit(1), Next(Act.RESTART, 0)),
        ([LEASE, RUN_CRASH], 0, False, fit(2), Next(Act.RESTART, 0)),
        # an unfit host's member is replaced; the others stay
        ([LOST], 0, False, ["it was lost"], Next(Act.REPLACE, 0, (0,), why="it was lost")),
        (
            [RUN_CRASH, LOST, RUN_CRASH],
            1,
            False,
            [None, "it was lost", "it is draining"],
            Next(Act.REPLACE, 1, (1, 2), why="it was lost"),
        ),
        (
            [CRASH, RUN_CRASH],
            0,
            False,
            [None, "it is draining"],
            Next(Act.REPLACE, 0, (1,), why="it is draining"),
        ),
        # a planned stop: off the hosts that must be left, else again in place, for free
        (
            [DRAINED],
            0,
            False,
            ["it is draining"],
            Next(Act.REPLACE, 0, (0,), planned=True, why="it is draining"),
        ),
        ([INTERRUPTED], 0, False, fit(1), Next(Act.RESTART, 0, planned=True)),
        ([DRAINED, RUN_CRASH], 0, False, fit(2), Next(Act.RESTART, 0, planned=True)),
        # a member that could not load the step chosen: again in place, from an older step; a
        # peer whose collective failed because of it is never what ended the run
        ([REFUSED], 0, False, fit(1), Next(Act.RESTART, 0, retry=True)),
        ([RUN_CRASH, REFUSED, RUN_CRASH], 0, False, fit(3), Next(Act.RESTART, 1, retry=True)),
        ([CRASH, REFUSED], 0, False, fit(2), Next(Act.RESTART, 0)),
        (
            [REFUSED, LOST],
            0,
            False,
            [None, "it was lost"],
            Next(Act.REPLACE, 0, (1,), why="it was lost"),
        ),
    ],
)
def test_what_a_runs_ends_ask_for(
    ends: list[Outcome], first: int, stop: bool, unfit_: list[str | None], want: Next
) -> None:
    assert what_next(ends, first, stop_requested=stop, unfit=unfit_) == want


def test_a_decision_on_ends_that_do_not_add_up_is_refused() -> None:
    with pytest.raises(ValueError, match="2 ends, 1 fitness"):
        what_next([CRASH, CRASH], 0, stop_requested=False, unfit=[None])
    with pytest.raises(ValueError, match="first 1"):
        what_next([CRASH], 1, stop_requested=False, unfit=[None])


def test_a_host_is_unfit_for_what_its_end_says_and_for_what_the_fleet_knows(
    tmp_path: Path,
) -> None:
    fleet: Fleet = services(tmp_path, Calls()).fleet
    for h in "abc":
        fleet.set_state(h, HostState.UP, "test")
    assert unfit(fleet, "a", CRASH, {}) is None
    assert unfit(fleet, "a", LOST, {}) == "it was lost"
    assert unfit(fleet, "a", PREEMPTED, {}) == "it is being preempted"
    assert unfit(fleet, "a", INTERRUPTED, {}) is None, "a Ctrl-C says nothing of the host"
    assert unfit(fleet, "a", CRASH, {"a": "the job is moved off it"}) == "the job is moved off it"
    fleet.set_state("b", HostState.DRAINING, "test")
    assert unfit(fleet, "b", DRAINED, {}) == "it is draining"


@pytest.mark.parametrize("kind", ["one host", "group"])
def test_a_crash_takes_the_restart_budget_and_past_it_the_member_is_replaced(
    tmp_path: Path, kind: str
) -> None:
    svc = services(tmp_path, Calls())
    sup = Supervisor(svc, "j" if kind == "one host" else "g")
    live, limit = sup.live, svc.inv.console.restart_limit
    live.machine.move(JobState.DEPLOYING)
    live.machine.move(JobState.RUNNING)
    restart = Next(Act.RESTART, 0)
    for n in range(limit):
        assert budgeted(restart, sup._restarts, "a", "boom", 7) == restart
        assert live.rec.restarts == n + 1
        live.machine.move(JobState.DEPLOYING)
        live.machine.move(JobState.RUNNING)
    spent = budgeted(restart, sup._restarts, "a", "boom", 7)
    assert (spent.act, spent.replace) == (Act.REPLACE, (0,))
    assert live.rec.crash_looped == ["a"] and live.state is JobState.RESTARTING
    planned = Next(Act.RESTART, 0, planned=True)
    assert budgeted(planned, sup._restarts, "a", "drain", 7) == planned, "a planned stop is free"
    live.machine.move(JobState.FAILING_OVER)
    live.machine.move(JobState.DEPLOYING)
    live.machine.move(JobState.RUNNING)
    loop = budgeted(restart, sup._restarts, "c", "boom", 7)
    assert loop.act is Act.CRASH_LOOP and "crash-looped on a and then c" in loop.why


@pytest.mark.parametrize("kind", ["one host", "group"])
async def test_a_stop_no_operator_asked_for_fails_the_job_whatever_its_kind(
    tmp_path: Path, kind: str
) -> None:
    """Found in the merge into one decision: a group whose member said Stopped (another
    console's stop, a local one) restarted, where a single host's job failed as stopped."""
    svc = services(tmp_path, Calls())
    for h in "abc":
        svc.fleet.set_state(h, HostState.UP, "test")
    sup = running(svc, kind, ["a", "b"])
    live = sup.live
    assert await recovered(sup, [STOPPED, RUN_CRASH]) is None
    assert live.state is JobState.FAILED and live.failure is FailureKind.STOPPED
    assert "stopped: operator" in live.why
    assert not live.rec.stopped, "not an operator's stop: a start later is no restart"
    assert live.rec.restarts == 0


async def test_a_single_hosts_planned_stop_on_a_fit_host_restarts_there_for_free(
    tmp_path: Path,
) -> None:
    """Found in the merge into one decision: a single host's job left a host still fit after a
    planned stop (a Ctrl-C of its executor, which says nothing of the host), where a group
    restarted on it. A move the operator or a GPU warning asks for marks the host to be left
    (``LiveJob.leave``): that one still moves."""
    svc = services(tmp_path, Calls())
    for h in "abc":
        svc.fleet.set_state(h, HostState.UP, "test")
    live = (one := running(svc, "one host", ["a"])).live

    async def step(new: list[int], planned: bool = False) -> int | None:
        assert new == [], "in place"
        return 20

    one._resume.step = step  # type: ignore[method-assign]
    assert await recovered(one, [INTERRUPTED]) == (20,)
    assert live.state is JobState.RESTARTING and live.rec.restarts == 0
    assert svc.fleet.hosts["a"].state is HostState.UP


async def test_a_groups_peer_stopped_member_read_first_restarts_the_group_not_stops_it(
    tmp_path: Path,
) -> None:
    """Found in the merge into one decision: the member whose Stopped (``peer_stopped``: its
    group agreed to stop at a step) was read before the crashed member's end was taken for
    what ended the run, and the job failed as stopped. The crash's restart is what follows,
    counted against the crashed member's host."""
    svc = services(tmp_path, Calls())
    for h in "abc":
        svc.fleet.set_state(h, HostState.UP, "test")
    sup = running(svc, "group", ["a", "b"])
    assert isinstance(sup, Supervisor)
    resumed: list[list[int]] = []

    async def step(new: list[int], planned: bool = False) -> int | None:
        resumed.append(new)
        return 20

    sup._resume.step = step  # type: ignore[method-assign]
    assert await recovered(sup, [PEER, CRASH]) == (20,)
    assert sup.live.state is JobState.RESTARTING and sup.live.rec.restarts == 1
    assert resumed == [[]], "every member restarts in place"
    assert sup.live.why.endswith("on b"), sup.live.why


@pytest.mark.parametrize("kind", ["one host", "group"])
async def test_a_job_over_on_a_draining_host_leaves_it_drained(tmp_path: Path, kind: str) -> None:
    """Drained while its job finished there (or failed, or was stopped): nothing is left to
    move off it. It stayed draining, a state an operator could neither drain nor undrain."""
    svc = services(tmp_path, Calls())
    for h in "abc":
        svc.fleet.set_state(h, HostState.UP, "test")
    sup = running(svc, kind, ["a", "b"])
    svc.fleet.set_state("a", HostState.DRAINING, "operator")
    assert await recovered(sup, [FIN, FIN]) is None
    assert sup.live.state is JobState.FINISHED
    assert svc.fleet.hosts["a"].state is HostState.DRAINED
    assert svc.store.host("a").drained and not svc.store.host("a").draining
    assert svc.fleet.hosts["b"].state is HostState.UP


async def test_a_nan_every_member_reports_is_one_incident_however_late_a_report_is_read(
    tmp_path: Path,
) -> None:
    """Found in a fresh-clone run (test_group_local's NaN-and-OOM test): a member's report of
    the group's NaN read after the incident was resolved opened a second incident, never
    resolved, and the OOM that followed was taken into it. Another NaN at the same step after
    every member reported the first is an incident of its own."""
    svc = services(tmp_path, Calls())
    for h in "abc":
        svc.fleet.set_state(h, HostState.UP, "test")
    sup = running(svc, "group", ["a", "b"])
    assert isinstance(sup, Supervisor)
    a, b = Member(0, "a", last_seen=1.0), Member(1, "b", last_seen=1.0)
    say = sup._messages.on_message
    epoch = sup.live.epoch

    def trained_to(step: int) -> None:
        say(a, Resumed(step=60, checkpoint=None, epoch=epoch, load_s=0.1))
        say(a, Progress(step=step, steps=400, loss=1.0, steps_per_s=10.0, epoch=epoch))

    def opened() -> list[tuple[str, bool]]:
        return [(i.fault_class, i.resolved) for i in incidents(read(svc.journal.path))]

    say(a, Fault(fault=FaultKind.NAN, message="loss is nan", step=70))
    trained_to(61)
    assert opened() == [("nan", True)]
    say(b, Fault(fault=FaultKind.NAN, message="loss is nan", step=70))  # read late
    assert opened() == [("nan", True)], "b's report of the same NaN"
    say(b, Fault(fault=FaultKind.OOM, message="CUDA out of memory", step=130))
    trained_to(131)
    assert opened() == [("nan", True), ("oom", True)]
    say(a, Fault(fault=FaultKind.NAN, message="loss is nan", step=70))  # after the rollback
    assert opened()[-1] == ("nan", False), "another NaN at that step: its own incident"


@pytest.mark.parametrize("kind", ["one host", "group"])
async def test_a_step_a_member_cannot_load_is_retried_older_once_for_free_then_paid_for(
    tmp_path: Path, kind: str
) -> None:
    """A member that could not load the step chosen (``resume_failed``) spent one of the job's
    restarts in place, as a crash does: three damaged steps in a row and the job moved off a
    host with nothing wrong with it, or failed as a crash loop. The retry is free once per host
    and step (the step is refused there, so the next resume is older and retries end), even
    when the member's Fault saying which step was never read; the same refusal again, or one
    of a run found at console start (its step not this console's choice), is paid for."""
    svc = svc_up(tmp_path)
    sup = running(svc, kind, ["a", "b"])
    live, resume = sup.live, sup._resume

    async def step(new: list[int], planned: bool = False) -> int | None:
        return 30  # the next resume's choice

    resume.step = step  # type: ignore[method-assign]
    ends = [REFUSED, RUN_CRASH]
    # the epoch that just ended was told to resume from step 40
    assert await recovered(sup, ends, resume=40) == (30,)
    assert live.state is JobState.RESTARTING and live.rec.restarts == 0, live.why
    assert "no restart spent" in live.why
    assert ("a", 40) in resume._refused, "refused from the end alone: no Fault was read"
    restart_again(live)
    assert await recovered(sup, ends, resume=30) == (30,), "step 30 refused too: free again"
    assert live.rec.restarts == 0 and ("a", 30) in resume._refused
    restart_again(live)
    # told the same step again (a console's choice gone wrong): paid for
    assert await recovered(sup, ends, resume=30) == (30,)
    assert live.rec.restarts == 1, live.why
    restart_again(live)
    # a run found at console start: its step not this console's choice, paid for
    assert await recovered(sup, ends, resume=None) == (30,)
    assert live.rec.restarts == 2, live.why


def svc_up(tmp_path: Path) -> JobServices:
    svc = services(tmp_path, Calls())
    for h in "abc":
        svc.fleet.set_state(h, HostState.UP, "test")
    return svc


def restart_again(live: LiveJob) -> None:
    """The restart decided: the job deploys and runs again, as the next epoch does."""
    live.machine.move(JobState.DEPLOYING)
    live.machine.move(JobState.RUNNING)


def test_a_run_ended_for_a_step_it_could_not_load_reads_as_such_from_the_link_and_the_events() -> (
    None
):
    msg = RunEnded(
        step=0,
        fault=FaultKind.RESUME_FAILED,
        message="cannot resume from the committed step 40: bad checksum",
        exit_code=1,
    )
    end = run_end(msg)
    assert end is not None and end.exit is Exit.RESUME_FAILED
    assert end.why == "resume_failed: cannot resume from the committed step 40: bad checksum"
    tail = from_events_tail(msgspec.json.encode(msg).decode() + "\n")
    assert tail.exit is Exit.RESUME_FAILED
