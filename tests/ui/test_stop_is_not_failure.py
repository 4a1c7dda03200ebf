"""An operator's stop is not a failure (issue 29): after ``s`` the job reads ``stopped``, and no
alert (the webhook's) says ``job j failed (stopped)``. Before, it read ``failed (stopped)``
and the webhook was told the job had failed. The job is the command kind running a stdlib
script: the subject is the console, not torch."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
from support.fleetbed import local_host, stdlib_job, write_inventory
from support.uibed import console_app, table, wait_for

from console.records.journal import Kind
from console.states import JobState
from console.supervise.policy import Policy
from console.ui.screens.confirm import ConfirmScreen

SIZE = (120, 40)
pytestmark = pytest.mark.usefixtures("reap_executors")  # conftest: its processes killed after
DONE = "marker: every alert before this one was posted"


@pytest.fixture
def webhook() -> Iterator[tuple[str, list[str]]]:
    """A Slack-compatible webhook on loopback; the texts it was posted, in order."""
    received: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            received.append(json.loads(body)["text"])
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    httpd = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_port}/hook", received
    httpd.shutdown()


async def test_s_stops_the_job_as_stopped_with_no_failure_alert(
    tmp_path: Path, webhook: tuple[str, list[str]]
) -> None:
    url, received = webhook
    inventory = write_inventory(
        tmp_path / "inventory.toml",
        hosts={"a": local_host(tmp_path / "a"), "b": local_host(tmp_path / "b", role="spare")},
        jobs={"j": {"host": "a", "spares": ["b"], **stdlib_job(steps=5000)}},
        webhook=url,
    )
    app, events = console_app(inventory)
    ctl = app.ctl
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("2")
        await wait_for(pilot, lambda: ctl.jobs["j"].step >= 10, 90, "j training")
        await pilot.press("s")
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("y")
        await wait_for(pilot, lambda: ctl.jobs["j"].state.is_terminal(), 60, "j ended")
        assert ctl.jobs["j"].state is JobState.STOPPED
        await wait_for(pilot, lambda: table(app).cell("j", "state") == "stopped", 5, "shown")
        ctl.alert(DONE)  # the webhook posts in order: what came before has arrived by then
        await wait_for(pilot, lambda: DONE in received, 20, "the marker posted")
        assert not [t for t in received if "failed" in t], received
        assert not [e.msg for e in events if e.kind is Kind.ALERT and "failed" in e.msg]
        states = [e.data["to"] for e in events if e.kind is Kind.JOB_STATE and e.job == "j"]
        assert states[-1] == "stopped" and "failed" not in states, states

        stopped_at = ctl.jobs["j"].step
        assert f" {stopped_at}/5000 " in table(app).cell("j", "progress")
        await pilot.press("g")
        # started again, before its executor says where it resumes: the job's last step, not 0
        shown = []
        while table(app).cell("j", "state") != "running":
            shown.append(table(app).cell("j", "progress"))
            await pilot.pause(0.1)
            assert len(shown) < 600, "running again within a minute"
        assert shown and all(f" {stopped_at}/5000 " in p for p in shown), shown


async def test_a_denied_failover_stops_the_job_with_no_failure_alert(
    tmp_path: Path, webhook: tuple[str, list[str]]
) -> None:
    """A denial is the operator's decision too: the job is stopped, not failed."""
    url, received = webhook
    inventory = write_inventory(
        tmp_path / "inventory.toml",
        hosts={"a": local_host(tmp_path / "a"), "b": local_host(tmp_path / "b", role="spare")},
        jobs={"j": {"host": "a", "spares": ["b"], **stdlib_job(steps=5000)}},
        webhook=url,
    )
    app, events = console_app(inventory, Policy.MANUAL)
    ctl = app.ctl
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("2")
        await wait_for(pilot, lambda: ctl.jobs["j"].step >= 10, 90, "j training")
        ctl.kill_host("a")
        await wait_for(pilot, lambda: ctl.jobs["j"].approval is not None, 30, "asked")
        await pilot.press("x", "y")
        await wait_for(pilot, lambda: ctl.jobs["j"].state.is_terminal(), 30, "j ended")
        assert ctl.jobs["j"].state is JobState.STOPPED
        await wait_for(pilot, lambda: table(app).cell("j", "state") == "stopped", 5, "shown")
        ctl.alert(DONE)
        await wait_for(pilot, lambda: DONE in received, 20, "the marker posted")
        assert not [t for t in received if "failed (" in t], received
        assert not [e.msg for e in events if e.kind is Kind.ALERT and "failed (" in e.msg]
    assert ctl.store.job("j").stopped, "it stays stopped under the next console"
