"""The operator console: a Textual view over the fleet controller.

The app owns no fleet state. It runs the controller in a worker, redraws the active view
from the controller at a fixed rate, turns journal events into notifications, and calls
the controller's actions (asking first for destructive ones; none in read-only mode).
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Callable
from typing import ClassVar

from textual.app import App, ScreenStackError
from textual.binding import Binding, BindingType
from textual.screen import ModalScreen
from textual.worker import Worker

from console.controller import Controller
from console.records.journal import Event, Kind
from console.service.attach import Attachment
from console.service.client import Remote
from console.supervise.refusal import Refused
from console.ui.actions import Action
from console.ui.commands import HotspareCommands
from console.ui.messages import JournalEvent
from console.ui.screens.base import LiveScreen, ViewScreen
from console.ui.screens.confirm import ConfirmScreen
from console.ui.screens.fleet import FleetScreen
from console.ui.screens.help import HelpScreen
from console.ui.screens.host_detail import HostDetailScreen
from console.ui.screens.incidents import IncidentsScreen
from console.ui.screens.job_detail import JobDetailScreen
from console.ui.screens.jobs import JobsScreen
from protocol.errors import ConfigError

REDRAW_HZ = 4.0
NOTIFY_PHASES = frozenset({"detected", "decided", "ended", "resolved"})
QUIT_NOTE = (
    "q or Ctrl-C quits the console only: executors keep training for console.unattended_s "
    "(a console started within it reattaches)."
)


class HotspareApp(App[int]):
    CSS_PATH = "hotspare.tcss"
    TITLE = "hotspare"
    VIEWS: ClassVar[dict[str, type[ViewScreen]]] = {
        "fleet": FleetScreen,
        "jobs": JobsScreen,
        "incidents": IncidentsScreen,
    }
    """The list views, one Textual mode each, switched with 1, 2, 3 (and tab)."""
    DEFAULT_MODE = "fleet"
    COMMANDS = App.COMMANDS | {HotspareCommands}
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("1", "view('fleet')", "fleet", id="app.fleet", show=False),
        Binding("2", "view('jobs')", "jobs", id="app.jobs", show=False),
        Binding("3", "view('incidents')", "incidents", id="app.incidents", show=False),
        Binding("tab", "next_view", "next view", id="app.next_view", priority=True, show=False),
        Binding("colon", "command_palette", "commands", id="app.commands"),
        Binding("question_mark", "help", "keys", id="app.help"),
        Binding("q", "quit", "quit", id="app.quit"),
        # as in k9s, htop and nvitop (Textual's own ctrl+c only says how to quit)
        Binding("ctrl+c", "quit", "quit", id="app.quit_ctrl_c", show=False, priority=True),
    ]

    def __init__(
        self,
        ctl: Controller,
        *,
        supervise: bool = True,
        freeze_startup: bool = False,
        attached: Attachment | None = None,
    ) -> None:
        """``supervise=False`` shows the controller's state without running it (snapshots).

        ``attached``: a view of a controller service. ``ctl`` is then this view's read-only
        copy (it watches the hosts itself), the controller tells it each job's state, and the
        actions go to the controller (none from a read-only view).

        ``freeze_startup`` (the ``hotspare`` command) moves what exists once the console is up
        out of the garbage collector's reach (``gc.freeze``): modules, Textual, the inventory
        and the fleet live as long as the console does, and a full collection that scans
        them stalls the screen (113 ms at 1000 hosts; 46 ms frozen). Off by default, since a
        process that runs many apps (the tests) would keep each one's garbage.
        """
        super().__init__()
        self.ctl = ctl
        self.attached = attached
        self.acts: Controller | Remote = (
            attached.actions if attached is not None and attached.actions is not None else ctl
        )
        """Where actions go: this process's controller, or the service's."""
        self.supervise = supervise
        self.freeze_startup = freeze_startup
        self.last_event = ""
        self.redraws = 0
        self._controller: Worker[object] | None = None
        self._closed = False
        self.views = {name: view() for name, view in self.VIEWS.items()}
        for name, screen in self.views.items():
            self.add_mode(name, lambda screen=screen: screen)  # type: ignore[misc]
        self._instant_switch = False

    # ------------------------------------------------------------ lifecycle

    def on_mount(self) -> None:
        self.sub_title = self._subtitle()
        self.ctl.journal.subscribe(lambda e: self.post_message(JournalEvent(e)))
        if self.supervise:
            self._controller = self.run_worker(
                self.ctl.run(stay=True), name="controller", exclusive=True, group="controller"
            )
        if self.attached is not None:
            self.run_worker(
                self.attached.follow(self.ctl.jobs, self.ctl.fleet.hosts),
                name="follow",
                group="follow",
            )
        self.set_interval(1 / REDRAW_HZ, self.redraw, name="redraw")
        if self.freeze_startup:
            self.call_after_refresh(_freeze_startup)

    def _subtitle(self) -> str:
        if self.attached is not None:
            return self.attached.line()
        return f"policy {self.ctl.policy.value}" + (
            " · READ-ONLY: every action is off" if self.ctl.read_only else ""
        )

    @property
    def may_act(self) -> bool:
        """Actions go somewhere: not a read-only console (an acting view's own copy of the
        controller is read-only, its actions go to the service)."""
        return not (self.acts is self.ctl and self.ctl.read_only)

    def key_shown(self, binding: Binding) -> bool:
        """The key bar shows a read-only console's navigation only: its actions are off (a
        key pressed still says so)."""
        return self.may_act or not (binding.id and _is_action(binding.id))

    @property
    def quit_note(self) -> str:
        return QUIT_NOTE if self.attached is None else self.attached.quit_note()

    async def on_unmount(self) -> None:
        await self.close_controller()

    async def action_quit(self) -> None:
        """q: close the controller first (its last leases, "console stopped" in the journal),
        then leave. Left to unmount, the app was gone before the close finished, and the next
        console took the quit for a crash (a console_restart incident)."""
        await self.close_controller()
        self.exit()

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
        if not self.is_running:  # shutting down: screens lose their widgets before their timers
            return
        try:
            screen = self.screen
        except ScreenStackError:  # a tick while the app shuts down
            return
        if self.attached is not None:
            self.sub_title = self._subtitle()
        if isinstance(screen, LiveScreen) and screen.ready:
            screen.draw()
            self.redraws += 1

    # --------------------------------------------------------------- events

    def on_journal_event(self, message: JournalEvent) -> None:
        e = message.event
        self.last_event = _event_line(e)
        match e.kind:
            case Kind.ALERT:
                self.notify(e.msg, title="alert", severity="error", timeout=10, markup=False)
            case Kind.FAULT:
                self.notify(e.msg, title="fault", severity="warning", timeout=8, markup=False)
            case Kind.WARNING:
                self.notify(e.msg, title="warning", severity="warning", timeout=8, markup=False)
            case Kind.INCIDENT if e.data.get("phase") in NOTIFY_PHASES:
                self.notify(e.msg, title="incident", severity="warning", timeout=8, markup=False)
            case Kind.FINISHED:
                self.notify(_short_sha(e), title="finished", timeout=8, markup=False)

    # -------------------------------------------------------------- actions

    def act(self, what: str, do: Callable[[], object], *, confirm: str | None = None) -> None:
        """Run an operator action, asking first when ``confirm`` is given."""
        if not self.may_act:
            self.notify(f"read-only console: {what} is off", severity="warning", markup=False)
            return

        def run(yes: bool | None = True) -> None:
            if not yes:
                self.notify(f"{what}: cancelled", timeout=3, markup=False)
                return
            try:
                do()
            except Refused as err:
                self.notify(f"{what}: refused ({err})", severity="warning", markup=False)
                return
            except (PermissionError, ValueError, KeyError, ConfigError, ConnectionError) as err:
                self.notify(f"{what}: {err}", severity="error", markup=False)
                return
            self.notify(f"{what}: done", timeout=3, markup=False)
            self.redraw()

        if confirm is None:
            run()
        else:
            self.push_screen(ConfirmScreen(confirm), run)

    def perform(self, action: Action, keys: list[str], noun: str) -> None:
        """One action on one or several jobs or hosts, confirmed once where it asks first."""
        label = keys[0] if len(keys) == 1 else f"{len(keys)} {noun}s ({', '.join(keys)})"

        def each() -> None:
            """Every target it may be done to; those refused are said (all refused: refused)."""
            refused: list[str] = []
            for key in keys:
                try:
                    action.run(self.acts, key)
                except Refused as err:
                    refused.append(str(err))
            if len(refused) == len(keys):
                raise Refused("; ".join(refused))
            if refused:
                self.notify(f"{action.verb}: refused ({'; '.join(refused)})", markup=False)

        if action.ask_one is not None and len(keys) == 1:
            confirm: str | None = action.ask_one(self.ctl, keys[0])
        else:
            confirm = action.confirm.format(label) if action.confirm else None
        self.act(f"{action.verb} {label}", each, confirm=confirm)

    def stop_controller(self) -> None:
        """The palette's ``stop the controller`` (an acting view's): asked first, then the
        controller closes and this view, with nothing left to show, closes too."""
        attached = self.attached
        if attached is None or attached.actions is None:
            return

        def stop() -> None:
            attached.stop()
            self.exit()

        self.act(
            f"stop the controller (pid {attached.pid})",
            stop,
            confirm=(
                f"Stop the controller (pid {attached.pid})? Every executor trains on for "
                "console.unattended_s, then stops unless a controller is started again."
            ),
        )

    def fail_over_to(self, job: str, host: str) -> None:
        self.act(
            f"fail over {job} to {host}",
            lambda: self.acts.fail_over(job, host),
            confirm=f"Fail {job} over to {host} now?",
        )

    def action_view(self, mode: str) -> None:
        """Show a list view, redrawn first if it has been shown before.

        Textual holds the first frame after a mode switch for 50 ms, to hide a screen still
        composing. A view already mounted is redrawn here instead, so its first frame is
        current and is not held: that delay was half the latency budget of a key press.
        """
        view = self.views[mode]
        if mode == self.current_mode:
            return
        if view.ready:
            view.draw()
            self._instant_switch = True
        try:
            self.switch_mode(mode)
        finally:
            self._instant_switch = False

    def delay_update(self, delay: float = 0.05) -> None:
        if not self._instant_switch:
            super().delay_update(delay)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Tab switches views only where a view is in front: over a form or a dialog it is
        not taken, and moves between the form's fields."""
        return not (action == "next_view" and isinstance(self.screen, ModalScreen))

    def action_next_view(self) -> None:
        modes = list(self.VIEWS)
        self.action_view(modes[(modes.index(self.current_mode) + 1) % len(modes)])

    def view_keys(self) -> list[tuple[str, str, LiveScreen]]:
        """Each list view's key, label and screen, in the order of ``VIEWS`` (the view bar)."""
        keys = {b.action: self.get_key_display(b) for b in _bindings(self.BINDINGS)}
        return [
            (keys[f"view('{mode}')"], screen.LABEL, screen) for mode, screen in self.views.items()
        ]

    def open_job(self, job: str) -> None:
        self.push_screen(JobDetailScreen(job))

    def open_host(self, host: str) -> None:
        self.push_screen(HostDetailScreen(host))

    def action_add_host(self) -> None:
        self.action_view("fleet")
        screen = self.screen
        if isinstance(screen, FleetScreen):
            screen.action_add_host()

    def action_help(self) -> None:
        screen = self.screen
        if not isinstance(screen, LiveScreen):
            return
        off = "" if self.may_act else " (off: read-only)"
        keys: list[tuple[str, str]] = []
        ours = [c for c in type(screen).__mro__ if c.__module__.startswith("console.ui")]
        for b in [b for cls in ours for b in _bindings(cls.__dict__.get("BINDINGS", []))]:
            key = self.get_key_display(b)
            if b.description and all(k != key for k, _ in keys):
                what = b.tooltip or b.description  # the key bar's word, or a longer one
                keys.append((key, what + (off if b.id and _is_action(b.id) else "")))
        keys += [(self.get_key_display(b), b.description) for b in _bindings(self.BINDINGS)]
        self.push_screen(HelpScreen(screen.TITLE_TEXT, keys, self.quit_note))


def _freeze_startup() -> None:
    gc.collect()
    gc.freeze()


def _is_action(binding_id: str) -> bool:
    """Bindings that change the fleet (off in read-only mode), as opposed to navigation."""
    return binding_id.split(".")[0] in ("fleet", "jobs", "host") and not binding_id.endswith(
        ".open"
    )


def _bindings(bindings: list[BindingType]) -> list[Binding]:
    return [b for b in bindings if isinstance(b, Binding)]


SHA_SHOWN = 12
"""Hex digits of a finished job's sha256 in its notification (all 64 wrapped over three
lines); the whole one stays in the journal, the job's log tail and ``hotspare report``."""


def _short_sha(e: Event) -> str:
    sha = str(e.data.get("params_sha256") or "")
    return e.msg.replace(sha, sha[:SHA_SHOWN] + "…") if len(sha) > SHA_SHOWN else e.msg


def _event_line(e: Event) -> str:
    return f"{time.strftime('%H:%M:%S', time.localtime(e.t))}  {e.msg}"
