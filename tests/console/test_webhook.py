"""Alerts reach a Slack-compatible webhook, through failures, and the URL is never shown."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
from support.fleetbed import until

from console.webhook import Webhook


class Hook:
    def __init__(self, fail_first: int) -> None:
        self.fail_first = fail_first
        self.status = 503
        self.calls = 0
        self.received: list[dict] = []


@pytest.fixture
def server() -> Iterator[tuple[str, Hook]]:
    hook = Hook(fail_first=2)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            hook.calls += 1
            body = self.rfile.read(int(self.headers["Content-Length"]))
            if hook.calls <= hook.fail_first:
                self.send_response(hook.status)
            else:
                hook.received.append(json.loads(body))
                self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    httpd = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_port}/services/T000/SECRET-TOKEN", hook
    httpd.shutdown()


async def test_alerts_are_posted_with_retries(server: tuple[str, Hook]) -> None:
    url, hook = server
    failures: list[str] = []
    w = Webhook(url, on_failure=failures.append, wait_max_s=0.2)
    task = asyncio.create_task(w.run())
    w.send("host a is down")
    w.send("job j failed over to b")
    await until(lambda: len(hook.received) == 2, 20, "two alerts")
    task.cancel()
    assert [r["text"] for r in hook.received] == ["host a is down", "job j failed over to b"]
    assert hook.calls == 4, "two 503s were retried"
    assert failures == []


async def test_an_unreachable_webhook_gives_up_without_showing_the_url(
    server: tuple[str, Hook],
) -> None:
    url, hook = server
    hook.fail_first = 1000
    failures: list[str] = []
    w = Webhook(url, on_failure=failures.append, wait_max_s=0.05)
    task = asyncio.create_task(w.run())
    w.send("x")
    await until(lambda: failures, 20, "giving up")
    task.cancel()
    assert hook.calls == 4, "bounded retries"
    assert "HTTP 503" in failures[0]
    assert "SECRET" not in failures[0]


@pytest.mark.parametrize(("status", "calls"), [(404, 1), (403, 1), (429, 4), (500, 4)])
async def test_a_webhook_that_refuses_for_good_is_not_asked_again(
    server: tuple[str, Hook], status: int, calls: int
) -> None:
    """A 4xx (a revoked or mistyped URL) is permanent: the operator hears of it after one try,
    not after four and their back-off; 429 and 5xx are retried."""
    url, hook = server
    hook.fail_first, hook.status = 1000, status
    failures: list[str] = []
    w = Webhook(url, on_failure=failures.append, wait_max_s=0.05)
    task = asyncio.create_task(w.run())
    w.send("x")
    await until(lambda: failures, 20, "giving up")
    task.cancel()
    assert hook.calls == calls
    assert f"HTTP {status}" in failures[0] and f"after {calls} tries" in failures[0]
    assert "SECRET" not in failures[0]
