"""What a lost link means, decided without processes: the one classifier that every job uses
(a single host's watch and each member of a group) driven through scripted answers, as
torchft's manager tests drive its decisions. The real-process tests (test_blip_no_incident,
test_probe_starved, test_console_offline, test_probe_hung, the chaos suite) prove the same
guarantees on real executors; these pin every branch and its order, including the ones a
real machine reaches only by chance (a starved probe at the lease's end, the console cut off
and back, a run that ended while unlinked).

Time is the script's: each ask of the host spends ``TICK`` of the lease, so "before the lease
ended" is a count of asks, not a race.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TypeVar

import pytest

from console.fleet.detect import DetectionSettings
from console.fleet.link import ExecutorLink, LinkError
from console.states import HostState
from console.supervise.link_loss import PROBE_MIN_S, LinkLoss
from console.supervise.outcome import Exit, Outcome
from console.supervise.probe import Answer
from protocol.messages import ExecutorHello

T = TypeVar("T")

TICK = 1.0
"""Lease seconds each ask of the host spends."""

DETECT = DetectionSettings(
    heartbeat_s=0.05, missed_heartbeats=1, suspect_after_s=0.0, lease_s=3.0, clock_skew_s=0.0
)

UNREACHABLE = Answer(alive=None, known=True, why="timed out")
STARVED = Answer(alive=None, known=False, why="starved")
ALIVE = Answer(alive=True, known=True)
GONE = Answer(alive=False, known=True)


def hello(state: str, epoch: int = 1) -> ExecutorHello:
    return ExecutorHello(
        version=4, executor="torch", pid=4242, hostname="a", workdir="/w", state=state, epoch=epoch
    )


@dataclass
class Script:
    """The world as the classifier sees it: what each relink and each ask finds, in order (the
    last one repeats), whether the console reaches other hosts, and everything it was told."""

    relinks: list[ExecutorHello | None] = field(default_factory=lambda: [None])
    answers: list[Answer] = field(default_factory=lambda: [UNREACHABLE])
    online: list[bool] = field(default_factory=lambda: [True])
    left_s: float = 2.5
    said: list[str] = field(default_factory=list)
    budgets: list[float] = field(default_factory=list)
    """What each ask of the host was given."""
    closed: int = 0

    @staticmethod
    def _next(items: list[T]) -> T:
        return items.pop(0) if len(items) > 1 else items[0]

    # the probe (link_loss.Asker)
    def workdir(self, host: str) -> str:
        return f"/{host}/jobs/j"

    async def ask(self, host: str, workdir: str, budget: float) -> Answer:
        self.budgets.append(budget)
        self.left_s -= TICK
        answer = self._next(self.answers)
        self.said.append(f"ask:{answer.why or answer.alive}")
        return answer

    def fair_budget(self, host: str) -> float:
        return 0.0

    async def hung(self, host: str, workdir: str) -> Outcome:
        self.said.append("killed")
        return Outcome(Exit.HUNG, "killed")

    async def ended(self, host: str) -> Outcome:
        self.said.append("read how it ended")
        return Outcome(Exit.CRASHED, "ended")

    # the fleet (link_loss.Hosts)
    def set_state(self, name: str, state: HostState, why: str) -> None:
        self.said.append(f"host:{state.value}")

    async def console_online(self, excluding: str) -> bool:
        online = self._next(self.online)
        self.said.append(f"online:{online}")
        return online

    def alert(self, text: str, **_: object) -> None:
        self.said.append(f"alert:{text}")

    # a link to the host's executor
    def link(self, host: str) -> ExecutorLink:
        return _Link(self)  # type: ignore[return-value]


class _Link:
    def __init__(self, script: Script) -> None:
        self._script = script
        self.hello: ExecutorHello | None = None

    async def open(self, timeout: float) -> ExecutorHello:
        got = Script._next(self._script.relinks)
        if got is None:
            raise LinkError("refused")
        self.hello = got
        return got

    def close(self) -> None:
        self._script.closed += 1


@dataclass
class Side:
    """The job's side: what it was told, in the script's log."""

    script: Script
    epoch: int = 1
    seen: float = 0.0  # silent from the start

    def last_seen(self) -> float:
        return self.seen

    def left(self) -> float:
        return self.script.left_s

    async def answered(self, link: ExecutorLink) -> None:
        self.script.said.append("answered")

    def faulted(self, link: ExecutorLink) -> Outcome:
        self.script.said.append("faulted")
        return Outcome(Exit.RUN_CRASHED, "ended while unlinked")

    def silent(self) -> None:
        self.script.said.append("silent")

    def unreachable(self) -> None:
        self.script.said.append("unreachable")

    def lost(self, fault_class: str) -> None:
        self.script.said.append(f"lost:{fault_class}")


async def classify(script: Script, side: Side | None = None) -> Outcome | None:
    loss = LinkLoss(
        "j",
        hosts=script,
        probe=script,
        detection=DETECT,
        heartbeat_s=DETECT.heartbeat_s,
        link=script.link,
        alert=script.alert,
    )
    return await loss.classify("a", "link closed", side or Side(script))


def decided_at(said: list[str]) -> int:
    """How many asks had been made when the loss was decided."""
    at = next(i for i, s in enumerate(said) if s.startswith("lost:"))
    return sum(s.startswith("ask:") for s in said[:at])


async def test_a_blip_relinks_at_once_and_nothing_is_asked_or_marked() -> None:
    script = Script(relinks=[hello("training")])
    assert await classify(script) is None
    assert script.said == ["answered"]


async def test_an_executor_that_stopping_still_runs_is_a_blip_too() -> None:
    script = Script(relinks=[hello("stopping")])
    assert await classify(script) is None
    assert script.said == ["answered"]


async def test_a_host_that_cannot_be_asked_is_lost_only_once_its_lease_ended() -> None:
    script = Script(answers=[UNREACHABLE], left_s=2.5)
    outcome = await classify(script)
    assert outcome is not None and outcome.exit is Exit.HOST_LOST
    # silent once, the host suspect, a target readied; lost after the third ask spent the lease
    assert script.said[:4] == ["ask:timed out", "host:suspect", "silent", "unreachable"]
    assert script.said.count("silent") == 1 and script.said.count("host:suspect") == 1
    assert decided_at(script.said) == 3, script.said
    assert script.said[-2:] == ["online:True", "lost:host_lost"]


async def test_a_frozen_executor_on_a_host_that_answers_is_killed_as_a_hang_at_the_lease_end() -> (
    None
):
    script = Script(answers=[ALIVE], left_s=1.5)
    outcome = await classify(script)
    assert outcome is not None and outcome.exit is Exit.HUNG
    assert "unreachable" not in script.said, "a host that answers needs no replacement readied"
    assert decided_at(script.said) == 2
    assert script.said[-2:] == ["lost:executor_hang", "killed"]


async def test_no_executor_left_is_read_at_once_without_waiting_out_the_lease() -> None:
    script = Script(answers=[GONE], left_s=100.0)
    outcome = await classify(script)
    assert outcome is not None and outcome.exit is Exit.CRASHED
    assert script.said == ["ask:False", "read how it ended"]
    assert not any(s.startswith("lost:") for s in script.said)


async def test_starved_probes_decide_nothing_even_long_past_the_lease() -> None:
    """Five starved asks, the lease long over: nothing decided, nothing readied; the first
    answer that may be acted on decides."""
    script = Script(answers=[STARVED] * 5 + [UNREACHABLE], left_s=0.5)
    outcome = await classify(script)
    assert outcome is not None and outcome.exit is Exit.HOST_LOST
    assert decided_at(script.said) == 6, script.said
    assert script.said.index("unreachable") > script.said.index("ask:timed out")


async def test_a_console_cut_off_from_every_host_decides_nothing_and_asks_again_once_back() -> None:
    """What was heard while the console reached no host says nothing of this one: back online,
    the host is asked afresh before it is called lost. The operator is alerted once."""
    script = Script(answers=[UNREACHABLE], online=[False, False, True], left_s=0.5)
    outcome = await classify(script)
    assert outcome is not None and outcome.exit is Exit.HOST_LOST
    alerts = [s for s in script.said if s.startswith("alert:")]
    assert alerts == ["alert:the console reaches no host at all: not failing j over"]
    back = script.said.index("online:True")
    assert script.said[back + 1].startswith("ask:"), "asked again once back online"
    assert script.said[-1] == "lost:host_lost"
    # near the lease's end an ask is cut short; the first once back online is a first ask
    asks_before = sum(s.startswith("ask:") for s in script.said[:back])
    assert script.budgets[0] == PROBE_MIN_S and script.budgets[1] < PROBE_MIN_S
    assert script.budgets[asks_before] == PROBE_MIN_S, script.budgets


async def test_a_run_that_ended_while_unlinked_is_its_ended_run_not_a_hang() -> None:
    """Found in the merge of the two classifiers: a single host's watch took an executor that
    answers 'faulted' at the job's epoch for none, asked its host (alive: it holds the lock)
    and killed it as a hang at the lease's end; a group's member was restarted in place."""
    script = Script(relinks=[None, hello("faulted")], answers=[UNREACHABLE], left_s=10.0)
    outcome = await classify(script)
    assert outcome is not None and outcome.exit is Exit.RUN_CRASHED
    assert script.said[-1] == "faulted"
    assert not any(s.startswith("lost:") for s in script.said)


async def test_an_executor_of_another_epoch_is_not_the_one_lost() -> None:
    """A newer or older executor on the host (another console's start) is not a relink."""
    script = Script(relinks=[hello("training", epoch=2)], answers=[UNREACHABLE], left_s=0.5)
    outcome = await classify(script)
    assert outcome is not None and outcome.exit is Exit.HOST_LOST
    assert "answered" not in script.said and script.closed >= 1


async def test_a_relink_after_the_silence_began_ends_the_loss() -> None:
    script = Script(relinks=[None, None, hello("training")], answers=[UNREACHABLE], left_s=5)
    assert await classify(script) is None
    assert script.said[-1] == "answered"
    assert "silent" in script.said and not any(s.startswith("lost:") for s in script.said)


async def test_an_executor_not_yet_silent_is_not_marked_suspect() -> None:
    """A link dropped by an executor still heard from moments ago: asked, never marked."""
    script = Script(relinks=[None, hello("training")], answers=[UNREACHABLE], left_s=5)
    side = Side(script, seen=time.monotonic() + 3600)
    assert await classify(script, side) is None
    assert "silent" not in script.said and "host:suspect" not in script.said


@pytest.mark.parametrize("answers", [[ALIVE, UNREACHABLE], [UNREACHABLE, ALIVE]])
async def test_the_newest_answer_that_may_be_acted_on_names_the_fault(
    answers: list[Answer],
) -> None:
    script = Script(answers=list(answers), left_s=1.5)
    await classify(script)
    want = "executor_hang" if answers[-1] is ALIVE else "host_lost"
    assert script.said.count(f"lost:{want}") == 1
