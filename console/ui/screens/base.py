"""What the Fleet and Jobs views share: a live table redrawn from the controller, and actions."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, cast

from textual.app import ComposeResult
from textual.screen import Screen
from textual.widgets import Footer, Header, Static

from console.ui.view import Row
from console.ui.widgets.live_table import LiveTable

if TYPE_CHECKING:
    from console.controller import Controller
    from console.ui.app import HotspareApp


class ViewScreen(Screen[None]):
    TITLE_TEXT = ""
    COLUMNS: tuple[str, ...] = ()

    @property
    def hotspare(self) -> HotspareApp:
        return cast("HotspareApp", self.app)

    @property
    def ctl(self) -> Controller:
        return self.hotspare.ctl

    @property
    def table(self) -> LiveTable:
        return self.query_one(LiveTable)

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(self.TITLE_TEXT, classes="view-title")
        yield LiveTable(self.COLUMNS)
        yield Static("", classes="last-event")
        yield Footer()

    def on_mount(self) -> None:
        self.redraw()

    def on_screen_resume(self) -> None:
        self.redraw()

    def rows(self) -> dict[str, Row]:
        raise NotImplementedError

    def redraw(self) -> int:
        """Bring the table up to date; returns the number of cells written."""
        written = self.table.sync(self.rows())
        self.query_one(".last-event", Static).update(self.hotspare.last_event)
        return written

    def act(self, what: str, do: Callable[[], object], *, confirm: str | None = None) -> None:
        self.hotspare.act(what, do, confirm=confirm)
