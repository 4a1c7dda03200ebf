"""Incidents: a timeline with fault class, MTTR and lost steps; Enter opens one's report."""

from __future__ import annotations

import io

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.widgets import Header, Markdown, Static

from console.records.report import render_incident
from console.ui.screens.base import LiveScreen, ViewScreen
from console.ui.view import Row
from console.ui.view_detail import INCIDENT_COLUMNS, incident_rows
from console.ui.widgets.key_bar import KeyBar


class IncidentsScreen(ViewScreen):
    TITLE_TEXT = "Incidents (newest first)"
    LABEL = "Incidents"
    NOTE = "newest first"
    COLUMNS = INCIDENT_COLUMNS
    NARROW_COLUMNS = ("#", "when", "job", "host", "class", "MTTR", "lost steps", "resolved")
    NOUN = "incident"
    BINDINGS = [Binding("enter", "open", "report", id="incidents.open", show=False)]

    def rows(self) -> dict[str, Row]:
        return incident_rows(self.ctl)

    def open(self, key: str) -> None:
        self.app.push_screen(IncidentReportScreen(int(key)))


class IncidentReportScreen(LiveScreen):
    """The post-mortem of one incident, as ``hotspare report`` writes it."""

    TITLE_TEXT = "Incident"
    BINDINGS = [Binding("escape", "app.pop_screen", "back", id="detail.back")]

    def __init__(self, incident: int) -> None:
        super().__init__()
        self.incident = incident
        self._shown = ""

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(f"Incident {self.incident}", classes="view-title")
        with VerticalScroll():
            yield Markdown("", id="report")
        yield KeyBar()

    def redraw(self) -> None:
        found = self.ctl.timeline.incident(self.incident)
        if found is None:
            text = f"Incident {self.incident} is not in the journal."
        else:
            out = io.StringIO()
            render_incident(found, out)
            text = out.getvalue()
        if text != self._shown:
            self._shown = text
            self.query_one("#report", Markdown).update(text)
