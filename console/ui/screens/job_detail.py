"""One job: loss and throughput curves, checkpoints and who holds them, log tail, incidents."""

from __future__ import annotations

import math

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import Header, Sparkline, Static

from console.ui.screens.job_actions import JOB_BINDINGS, JobActions
from console.ui.view_detail import (
    CHECKPOINT_COLUMNS,
    JOB_INCIDENT_COLUMNS,
    checkpoint_rows,
    event_lines,
    job_incident_rows,
    job_summary,
    lineage_lines,
    replica_lines,
)
from console.ui.widgets.key_bar import KeyBar
from console.ui.widgets.live_table import LiveTable

LOG_LINES = 12


def _curve_label(name: str, values: list[float], digits: int) -> str:
    if not values:
        return f"{name}: no progress yet"
    return (
        f"{name}  now {values[-1]:.{digits}f}   min {min(values):.{digits}f}   "
        f"max {max(values):.{digits}f}   ({len(values)} samples)"
    )


class JobDetailScreen(JobActions):
    TITLE_TEXT = "Job"
    BINDINGS = [
        Binding("escape", "app.pop_screen", "back", id="detail.back"),
        *JOB_BINDINGS,
    ]

    def __init__(self, job: str) -> None:
        super().__init__()
        self.job = job
        self._samples = -1

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static("", classes="view-title", id="job-summary", markup=False)
        with Horizontal(classes="curves"):
            with Vertical():
                yield Static("", id="loss-label")
                yield Sparkline([], id="loss", summary_function=max)
            with Vertical():
                yield Static("", id="speed-label")
                yield Sparkline([], id="speed", summary_function=max)
        with Horizontal(classes="detail-tables"):
            with Vertical():
                yield Static("Checkpoints (newest first)", classes="pane-title")
                yield LiveTable(CHECKPOINT_COLUMNS, id="checkpoints")
            with Vertical(classes="narrow"):
                yield Static("Incidents", classes="pane-title")
                yield LiveTable(JOB_INCIDENT_COLUMNS, id="incidents")
        yield Static("Replicas", classes="pane-title")
        yield Static("", id="replicas", markup=False)
        yield Static("Lineage", classes="pane-title")
        yield Static("", id="lineage", markup=False)
        yield Static("Log tail", classes="pane-title")
        yield Static("", id="log-tail", markup=False)
        yield KeyBar()

    def jobs_for_action(self) -> list[str]:
        return [self.job]

    def redraw(self) -> None:
        ctl = self.ctl
        sup = ctl.jobs[self.job]
        self.query_one("#job-summary", Static).update(job_summary(ctl, self.job))
        if len(sup.history) != self._samples or not sup.history:
            self._samples = len(sup.history)
            losses = [x[2] for x in sup.history if not math.isnan(x[2])]
            speeds = [x[3] for x in sup.history]
            self.query_one("#loss", Sparkline).data = losses
            self.query_one("#speed", Sparkline).data = speeds
            self.query_one("#loss-label", Static).update(_curve_label("loss", losses, 4))
            self.query_one("#speed-label", Static).update(_curve_label("steps/s", speeds, 1))
        self.query_one("#checkpoints", LiveTable).sync(checkpoint_rows(ctl, self.job))
        self.query_one("#replicas", Static).update(replica_lines(ctl, self.job))
        self.query_one("#lineage", Static).update(lineage_lines(ctl, self.job))
        self.query_one("#incidents", LiveTable).sync(job_incident_rows(ctl, self.job))
        tail = self.query_one("#log-tail", Static)
        n = max(LOG_LINES, tail.size.height)  # as many lines as the pane holds
        lines = event_lines(ctl.timeline.for_job(self.job, n)).splitlines()
        lines = sorted(lines + list(sup.log_tail)[-n:], key=lambda line: line[:8])
        tail.update("\n".join(lines[-n:]) or "(nothing yet)")
