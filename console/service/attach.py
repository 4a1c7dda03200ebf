"""A view attached to a controller service: who the controller is, its actions (for an acting
view), and the loop that keeps the view's jobs told of the controller's state.

Textual-free: the app shows ``line()`` in its title and ``quit_note()`` when it closes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from console.service.client import ControllerGone, Remote
from console.service.follow import HasLive, HoldsJob, tell, untell

ASK_EVERY_S = 1.0


class Link(Protocol):
    """How a view on another machine reaches the controller (``tunnel.ControllerTunnel``)."""

    lost_since: float | None

    def line(self) -> str: ...


class Attachment:
    def __init__(
        self, state_dir: Path, hello: Mapping[str, Any], *, acting: bool, via: Link | None = None
    ) -> None:
        self.state_dir = state_dir
        self.via = via
        """The SSH link of a view on another machine; None for a view on the controller's."""
        self.hello = dict(hello)
        self.actions: Remote | None = Remote(state_dir) if acting else None
        """The controller's operator actions; None for a read-only view."""
        self._asker = Remote(state_dir)
        self.answered_at = time.monotonic()
        self.stopped = False
        """Stopped from this view (its quit note says so)."""
        self.silent_since: float | None = None
        """Wall time the controller stopped answering the view; None while it answers."""

    @property
    def pid(self) -> int:
        return int(self.hello.get("pid", 0))

    @property
    def policy(self) -> str:
        return str(self.hello.get("policy", "?"))

    def line(self) -> str:
        """The title's words: which controller, how the view acts, and whether it answers."""
        who = f"controller pid {self.pid} on {self.hello.get('host', '?')}"
        if self.via is not None and self.via.lost_since is not None:
            return f"policy {self.policy} · {who}: {self.via.line()}"
        if self.via is not None:
            who = f"{who} {self.via.line()}"
        if self.silent_since is not None:
            since = time.strftime("%H:%M:%S", time.localtime(self.silent_since))
            return f"policy {self.policy} · {who} NOT ANSWERING since {since}"
        how = "acting view" if self.actions is not None else "READ-ONLY view: every action is off"
        return f"policy {self.policy} · {how} of {who}"

    def stop(self) -> None:
        """Ask the controller to stop (an acting view's palette action)."""
        assert self.actions is not None, "a read-only view stops nothing"
        self.actions.stop()
        self.stopped = True

    def quit_note(self) -> str:
        if self.stopped:
            return (
                f"the controller (pid {self.pid}) was stopped from this view; executors train "
                "on for console.unattended_s, and a controller started within it reattaches."
            )
        return (
            f"this view closed; the controller (pid {self.pid}) keeps every job training. "
            "`hotspare stop` ends it."
        )

    async def follow(self, jobs: Mapping[str, HasLive], hosts: Mapping[str, HoldsJob]) -> None:
        """Ask the controller for its jobs' state every ``ASK_EVERY_S``, until cancelled."""
        try:
            while True:
                try:
                    status = await asyncio.to_thread(self._asker.status)
                except ControllerGone:
                    if self.silent_since is None:
                        self.silent_since = time.time()
                    untell(jobs)
                else:
                    self.silent_since = None
                    self.answered_at = time.monotonic()
                    tell(jobs, hosts, status)
                await asyncio.sleep(ASK_EVERY_S)
        finally:
            self.close()

    def close(self) -> None:
        self._asker.close()
        if self.actions is not None:
            self.actions.close()


__all__ = ["Attachment"]
