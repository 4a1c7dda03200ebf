"""An operator's orders to a job that cannot take them now are reported, never raised."""

from __future__ import annotations

from pathlib import Path

from console.jobs.incident import OpenIncident
from console.jobs.live import LiveJob, Transitions
from console.jobs.orders import Orders
from console.records.incidents import IncidentLog
from console.records.journal import Journal, Kind, read
from console.records.state_store import JobRecord, StateStore
from console.states import JobState
from protocol.spec import JobSpec


def test_a_move_ordered_while_the_job_deploys_is_reported_not_delivered(tmp_path: Path) -> None:
    """Seen under load: "fail over j to c" pressed while j was being redeployed raised
    IllegalTransition (deploying -> checkpointing) inside the console."""
    journal = Journal(tmp_path / "journal.jsonl")
    alerts: list[str] = []

    def alert(msg: str, *, job: str | None = None, host: str | None = None) -> None:
        alerts.append(msg)

    live = LiveJob(name="j", spec=JobSpec(name="j", steps=10), rec=JobRecord(), host="a")
    live.machine.move(JobState.DEPLOYING)
    store = StateStore(tmp_path / "state.json")
    incident = OpenIncident(live, log=IncidentLog(journal, store), preparing=lambda: False)
    states = Transitions(live, journal=journal, alert=alert, alerted=lambda _: False)
    orders = Orders(
        live, states=states, incident=incident, journal=journal, alert=alert, wake=lambda: None
    )
    orders.request_move("migrate", "operator: fail over j", "c")
    journal.close()
    assert live.state is JobState.DEPLOYING
    assert live.incident is None and live.target is None
    (entry,) = [e for e in read(tmp_path / "journal.jsonl") if e.kind is Kind.ACTION]
    assert entry.data == {
        "order": "drain",
        "delivered": False,
        "error": "j is deploying, not training",
    }
    assert alerts == ["drain of j could not be delivered: j is deploying, not training"]
