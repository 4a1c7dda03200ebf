"""The operator console: a Textual view over the fleet controller.

The app owns no fleet state. It runs the controller in a worker, redraws the active view
from the controller at a fixed rate, turns journal events into notifications, and calls
the controller's actions (asking first for destructive ones; none in read-only mode).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import ClassVar

from textual.app import App
from textual.binding import Binding, BindingType
from textual.worker import Worker

from console.controller import Controller
from console.journal import Event, Kind
from console.ui.messages import JournalEvent
from console.ui.screens.base import ViewScreen
from console.ui.screens.confirm import ConfirmScreen
from console.ui.screens.fleet import FleetScreen
from console.ui.screens.help import HelpScreen
from console.ui.screens.jobs import JobsScreen

REDRAW_HZ = 4.0
NOTIFY_PHASES = frozenset({"detected", "decided", "resolved"})
QUIT_NOTE = "q quits the console only: executors keep training until their lease ends."


class HotspareApp(App[int]):
    CSS_PATH = "hotspare.tcss"
    TITLE = "hotspare"
    MODES: ClassVar[dict[str, type[ViewScreen]]] = {"fleet": FleetScreen, "jobs": JobsScreen}  # type: ignore[assignment]
    DEFAULT_MODE = "fleet"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("1", "view('fleet')", "fleet", id="app.fleet"),
        Binding("2", "view('jobs')", "jobs", id="app.jobs"),
        Binding("tab", "next_view", "next view", id="app.next_view", priority=True),
        Binding("question_mark", "help", "keys", id="app.help"),
        Binding("q", "quit", "quit (jobs keep running)", id="app.quit"),
    ]

    def __init__(self, ctl: Controller) -> None:
        super().__init__()
        self.ctl = ctl
        self.last_event = ""
        self.redraws = 0
        self._controller: Worker[object] | None = None
        self._closed = False

    # ------------------------------------------------------------ lifecycle

    def on_mount(self) -> None:
        self.sub_title = f"policy {self.ctl.policy.value}" + (
            " · READ-ONLY: every action is off" if self.ctl.read_only else ""
        )
        self.ctl.journal.subscribe(lambda e: self.post_message(JournalEvent(e)))
        self._controller = self.run_worker(
            self._run_controller(), name="controller", exclusive=True, group="controller"
        )
        self.set_interval(1 / REDRAW_HZ, self.redraw, name="redraw")

    async def _run_controller(self) -> None:
        states = await self.ctl.run()
        summary = ", ".join(f"{job} {state.value}" for job, state in states.items())
        self.notify(f"every job has ended: {summary}", timeout=10)

    async def on_unmount(self) -> None:
        await self.close_controller()

    async def close_controller(self) -> None:
        """Stop supervising (executors keep running) and close the journal; idempotent."""
        if self._closed:
            return
        self._closed = True
        worker = self._controller
        if worker is not None and not worker.is_finished:
            worker.cancel()
            with contextlib.suppress(Exception):
                await worker.wait()
        await self.ctl.close()

    def redraw(self) -> None:
        if isinstance(self.screen, ViewScreen):
            self.screen.redraw()
            self.redraws += 1

    # --------------------------------------------------------------- events

    def on_journal_event(self, message: JournalEvent) -> None:
        e = message.event
        self.last_event = _event_line(e)
        match e.kind:
            case Kind.ALERT:
                self.notify(e.msg, title="alert", severity="error", timeout=10)
            case Kind.FAULT:
                self.notify(e.msg, title="fault", severity="warning", timeout=8)
            case Kind.INCIDENT if e.data.get("phase") in NOTIFY_PHASES:
                self.notify(e.msg, title="incident", severity="warning", timeout=8)
            case Kind.FINISHED:
                self.notify(e.msg, title="finished", timeout=8)

    # -------------------------------------------------------------- actions

    def act(self, what: str, do: Callable[[], object], *, confirm: str | None = None) -> None:
        """Run an operator action, asking first when ``confirm`` is given."""
        if self.ctl.read_only:
            self.notify(f"read-only console: {what} is off", severity="warning")
            return

        def run(yes: bool | None = True) -> None:
            if not yes:
                self.notify(f"{what}: cancelled", timeout=3)
                return
            try:
                do()
            except (PermissionError, ValueError, KeyError) as err:
                self.notify(f"{what}: {err}", severity="error")
                return
            self.notify(f"{what}: done", timeout=3)
            self.redraw()

        if confirm is None:
            run()
        else:
            self.push_screen(ConfirmScreen(confirm), run)

    def action_view(self, mode: str) -> None:
        self.switch_mode(mode)

    def action_next_view(self) -> None:
        if isinstance(self.screen, ViewScreen):
            modes = list(self.MODES)
            self.switch_mode(modes[(modes.index(self.current_mode) + 1) % len(modes)])

    def action_help(self) -> None:
        screen = self.screen
        if not isinstance(screen, ViewScreen):
            return
        off = " (off: read-only)" if self.ctl.read_only else ""
        keys = [(b.key, b.description + off) for b in _bindings(screen.BINDINGS)]
        keys += [(b.key, b.description) for b in _bindings(self.BINDINGS)]
        self.push_screen(HelpScreen(screen.TITLE_TEXT, keys, QUIT_NOTE))


def _bindings(bindings: list[BindingType]) -> list[Binding]:
    return [b for b in bindings if isinstance(b, Binding)]


def _event_line(e: Event) -> str:
    return f"{time.strftime('%H:%M:%S', time.localtime(e.t))}  {e.msg}"
