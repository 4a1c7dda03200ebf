"""Alerts to a Slack-compatible webhook: a JSON POST ``{"text": ...}``, retried with backoff.

The URL is a secret (Slack puts the token in it): it is never logged or shown.
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import Callable

from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_exponential

from protocol.errors import HotspareError, retryable

TIMEOUT_S = 5.0
ATTEMPTS = 4
QUEUE_MAX = 100


class WebhookError(HotspareError):
    """An alert did not go out: unreachable, or refused for now (HTTP 408, 429, 5xx)."""

    permanent = False


class WebhookRefused(WebhookError):
    """The webhook refused the alert for good (HTTP 4xx: a revoked or mistyped URL, a bad
    body): not tried again, the operator is told at once."""

    permanent = True


def _refusal(code: int) -> WebhookError:
    if 400 <= code < 500 and code not in (408, 429):
        return WebhookRefused(f"HTTP {code}: refused, not tried again")
    return WebhookError(f"HTTP {code}")


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
                tries = 1 if e.permanent else ATTEMPTS
                if self._on_failure:
                    self._on_failure(f"webhook: giving up on an alert after {tries} tries: {e}")
            finally:
                self._queue.task_done()

    async def drain(self, timeout: float) -> None:
        """Give queued alerts a chance to go out (at shutdown)."""
        async with asyncio.timeout(timeout):
            await self._queue.join()

    async def _post(self, text: str) -> None:
        body = json.dumps({"text": text}).encode()
        async for attempt in AsyncRetrying(
            retry=retry_if_exception(retryable),
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
                    raise _refusal(resp.status)
        except urllib.error.HTTPError as e:
            raise _refusal(e.code) from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise WebhookError(f"cannot reach the webhook: {type(reason).__name__}") from None
