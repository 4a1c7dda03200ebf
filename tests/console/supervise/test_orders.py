"""An operator's orders to a job that cannot take them now: a move asked for while the job is
on its way to training is kept and made once it trains; one it can never take is reported,
never raised."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from console.records.incidents import IncidentLog, incidents
from console.records.journal import Journal, Kind, read
from console.records.state_store import JobRecord, StateStore
from console.states import JobState
from console.supervise.incident import OpenIncident
from console.supervise.live import LiveJob, Transitions
from console.supervise.orders import Orders
from protocol.faults import StopReason
from protocol.messages import ConsoleMessage, Drain
from protocol.spec import JobSpec


class Link:
    """What an executor's link is told."""

    def __init__(self) -> None:
        self.sent: list[ConsoleMessage] = []

    async def send(self, msg: ConsoleMessage) -> None:
        self.sent.append(msg)


class Bed:
    def __init__(self, tmp_path: Path, state: JobState) -> None:
        self.path = tmp_path / "journal.jsonl"
        self.journal = Journal(self.path)
        self.alerts: list[str] = []
        self.live = LiveJob(name="j", spec=JobSpec(name="j", steps=10), rec=JobRecord(), host="a")
        self.live.machine.move(JobState.DEPLOYING)
        if state is not JobState.DEPLOYING:
            self.live.machine.move(JobState.RUNNING)
            self.live.machine.move(state)
        store = StateStore(tmp_path / "state.json")
        incident = OpenIncident(
            self.live, log=IncidentLog(self.journal, store), preparing=lambda: False
        )
        self.states = Transitions(
            self.live, journal=self.journal, alert=self.alert, alerted=lambda _: False
        )
        self.orders = Orders(
            self.live,
            states=self.states,
            incident=incident,
            journal=self.journal,
            alert=self.alert,
            wake=lambda: None,
            hosts=lambda: [self.live.host] if self.live.host else [],
        )

    def alert(self, msg: str, *, job: str | None = None, host: str | None = None) -> None:
        self.alerts.append(msg)

    def trains_on(self, host: str) -> Link:
        """Launched (linked, Started, running, as ``Supervisor._launch_epoch`` does), then a step
        trained (``Orders.trains``, from each Progress)."""
        link = Link()
        self.live.host = host
        self.live.link = link  # type: ignore[assignment]
        self.states.move(JobState.DEPLOYING, f"on {host}")
        self.states.move(JobState.RUNNING, f"on {host}")
        self.orders.trains()
        return link

    def actions(self) -> list[dict[str, Any]]:
        self.journal.close()
        return [e.data for e in read(self.path) if e.kind is Kind.ACTION]


async def test_a_move_ordered_while_the_job_deploys_is_kept_and_made_once_it_trains(
    tmp_path: Path,
) -> None:
    """'f' pressed while j was redeployed (a loaded run): the order was dropped as not
    delivered (before that it raised IllegalTransition, deploying -> checkpointing)."""
    bed = Bed(tmp_path, JobState.DEPLOYING)
    bed.orders.request_move(StopReason.MIGRATE, "operator: fail over j", "c")
    assert bed.live.state is JobState.DEPLOYING, "nothing to checkpoint yet"
    assert bed.live.incident is None and bed.live.target is None
    assert bed.alerts == []
    link = bed.trains_on("a")
    await asyncio.sleep(0)  # the send is a task
    assert [type(m) for m in link.sent] == [Drain], link.sent
    assert bed.live.state is JobState.CHECKPOINTING
    assert bed.live.target == "c" and bed.live.incident is not None
    assert bed.live.move_kept is None
    kept, *_ = bed.actions()
    assert kept == {"order": "drain", "delivered": False, "kept": True, "target": "c"}


async def test_a_kept_move_waits_for_the_recovery_to_end(tmp_path: Path) -> None:
    """A move kept during a restart is made after the restart's incident resolved (its first
    step), not at the restart's Start, where it joined the crash's incident."""
    bed = Bed(tmp_path, JobState.RESTARTING)
    bed.live.incident = 1
    bed.orders.request_move(StopReason.MIGRATE, "operator: fail over j", "c")
    link = bed.trains_on("a")
    await asyncio.sleep(0)
    assert link.sent == [] and bed.live.move_kept is not None, "the recovery goes on"
    bed.live.incident = None  # its first step trained (Watch)
    bed.orders.trains()
    await asyncio.sleep(0)
    assert [type(m) for m in link.sent] == [Drain]
    bed.journal.close()
    (move,) = incidents(read(bed.path))  # 1 was the test's word only: none was opened for it
    assert move.planned and move.fault_class == "migrate", "an incident of its own"


async def test_a_kept_move_to_the_host_the_job_came_up_on_is_moot(tmp_path: Path) -> None:
    bed = Bed(tmp_path, JobState.RESTARTING)
    bed.orders.request_move(StopReason.MIGRATE, "operator: fail over j", "c")
    link = bed.trains_on("c")
    await asyncio.sleep(0)
    assert link.sent == [] and bed.live.state is JobState.RUNNING
    assert bed.actions()[-1] == {"order": "drain", "delivered": False, "moot": True, "target": "c"}


async def test_a_kept_move_of_a_job_told_to_stop_is_not_made(tmp_path: Path) -> None:
    bed = Bed(tmp_path, JobState.FAILING_OVER)
    bed.orders.request_move(StopReason.MIGRATE, "operator: fail over j", None)
    bed.orders.request_stop()  # no link: deferred, the job stops before anything starts
    link = bed.trains_on("b")
    await asyncio.sleep(0)
    assert not any(isinstance(m, Drain) for m in link.sent), link.sent
    assert bed.live.state is JobState.RUNNING


async def test_a_move_ordered_while_the_job_checkpoints_is_reported_not_delivered(
    tmp_path: Path,
) -> None:
    bed = Bed(tmp_path, JobState.CHECKPOINTING)
    bed.orders.request_move(StopReason.MIGRATE, "operator: fail over j", "c")
    assert bed.live.state is JobState.CHECKPOINTING and bed.live.move_kept is None
    assert bed.alerts == ["drain of j could not be delivered: j is checkpointing, not training"]
    (entry,) = bed.actions()
    assert entry == {
        "order": "drain",
        "delivered": False,
        "error": "j is checkpointing, not training",
    }


async def test_a_drain_of_an_unreachable_jobs_host_is_kept_until_it_answers_and_trains(
    tmp_path: Path,
) -> None:
    """Drained while j was silent (its lease being waited out): the Drain went over the dead
    link, and j, answering again, trained on the drained host. Kept now, and made at its
    first step after the answer."""
    bed = Bed(tmp_path, JobState.UNREACHABLE)
    bed.live.link = Link()  # type: ignore[assignment]  # the link that went silent
    bed.orders.request_move(StopReason.DRAIN, "operator drained a", off="a")
    assert bed.live.state is JobState.UNREACHABLE and bed.live.move_kept is not None
    assert bed.live.link.sent == [] and bed.alerts == []  # type: ignore[union-attr]
    link = Link()
    bed.live.link = link  # type: ignore[assignment]  # it answers again (LinkLoss)
    bed.states.move(JobState.RUNNING, "a answers again")
    bed.orders.trains()
    await asyncio.sleep(0)
    assert [type(m) for m in link.sent] == [Drain], link.sent
    assert bed.live.state is JobState.CHECKPOINTING


async def test_a_kept_drain_is_moot_once_the_job_trains_off_the_drained_host(
    tmp_path: Path,
) -> None:
    """Drained while j failed over off it: j trains on b, and the drain of a moves it no
    further (a kept move with no target moved it again, off the host it had just come to)."""
    bed = Bed(tmp_path, JobState.FAILING_OVER)
    bed.orders.request_move(StopReason.DRAIN, "operator drained a", off="a")
    link = bed.trains_on("b")
    await asyncio.sleep(0)
    assert link.sent == [] and bed.live.state is JobState.RUNNING
    assert bed.actions()[-1] == {"order": "drain", "delivered": False, "moot": True, "off": "a"}
