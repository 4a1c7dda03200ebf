"""Alerts to a Slack-compatible webhook: a JSON POST ``{"text": ...}``, retried with backoff.

The URL is a secret (Slack puts the token in it): it is never logged or shown.
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import Callable

from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_exponential

TIMEOUT_S = 5.0
ATTEMPTS = 4
QUEUE_MAX = 100


class WebhookError(Exception):
    pass


class Webhook:
    def __init__(
        self,
        url: str,
        *,
        on_failure: Callable[[str], object] | None = None,
        wait_max_s: float = 8.0,
    ) -> None:
        self._url = url
        self._queue: asyncio.Queue[str] = asyncio.Queue(QUEUE_MAX)
        self._on_failure = on_failure
        self._wait_max = wait_max_s
        self.sent = 0

    def send(self, text: str) -> None:
        """Queue an alert; if the queue is full the oldest is dropped, never the caller blocked."""
        if self._queue.full():
            self._queue.get_nowait()
            self._queue.task_done()
        self._queue.put_nowait(text)

    async def run(self) -> None:
        while True:
            text = await self._queue.get()
            try:
                await self._post(text)
                self.sent += 1
            except WebhookError as e:
                if self._on_failure:
                    self._on_failure(f"webhook: giving up on an alert after {ATTEMPTS} tries: {e}")
            finally:
                self._queue.task_done()

    async def drain(self, timeout: float) -> None:
        """Give queued alerts a chance to go out (at shutdown)."""
        async with asyncio.timeout(timeout):
            await self._queue.join()

    async def _post(self, text: str) -> None:
        body = json.dumps({"text": text}).encode()
        async for attempt in AsyncRetrying(
            retry=retry_if_exception_type(WebhookError),
            stop=stop_after_attempt(ATTEMPTS),
            wait=wait_exponential(multiplier=0.25, max=self._wait_max),
            reraise=True,
        ):
            with attempt:
                await asyncio.to_thread(self._post_once, body)

    def _post_once(self, body: bytes) -> None:
        req = urllib.request.Request(
            self._url, data=body, method="POST", headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=TIMEOUT_S) as resp:
                if resp.status >= 300:
                    raise WebhookError(f"HTTP {resp.status}")
        except urllib.error.HTTPError as e:
            raise WebhookError(f"HTTP {e.code}") from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise WebhookError(f"cannot reach the webhook: {type(reason).__name__}") from None
