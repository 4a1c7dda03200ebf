"""One host: each GPU's counters, utilisation and temperature history, alerts, health events."""

from __future__ import annotations

import time

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import Header, Sparkline, Static

from console.ui.screens.host_actions import HOST_BINDINGS, HostActions
from console.ui.view_detail import (
    GPU_COLUMNS,
    HEALTH_KINDS,
    event_lines,
    gpu_rows,
    host_summary,
    sample_label,
)
from console.ui.widgets.key_bar import KeyBar
from console.ui.widgets.live_table import LiveTable

HISTORY_LINES = 10


class HostDetailScreen(HostActions):
    TITLE_TEXT = "Host"
    BINDINGS = [
        Binding("escape", "app.pop_screen", "back", id="detail.back"),
        *HOST_BINDINGS,
    ]

    def __init__(self, host: str) -> None:
        super().__init__()
        self.host = host
        self._samples: tuple[int, str] = (-1, "")

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static("", classes="view-title", id="host-summary", markup=False)
        yield Static("GPUs", classes="pane-title", id="gpus-title", markup=False)
        yield LiveTable(GPU_COLUMNS, id="gpus")
        with Horizontal(classes="curves"):
            with Vertical():
                yield Static("", id="util-label")
                yield Sparkline([], id="util", summary_function=max)
            with Vertical():
                yield Static("", id="cpu-label")
                yield Sparkline([], id="cpu", summary_function=max)
        yield Static("", id="alerts", markup=False)
        yield Static("Health history", classes="pane-title")
        yield Static("", id="health-history", markup=False)
        yield KeyBar()

    def redraw(self) -> None:
        ctl = self.ctl
        rt = ctl.fleet.hosts[self.host]
        self.query_one("#host-summary", Static).update(host_summary(ctl, self.host))
        self.query_one("#gpus", LiveTable).sync(gpu_rows(ctl, self.host))
        label = sample_label(rt, time.monotonic())
        self.query_one("#gpus-title", Static).update(f"GPUs ({label})")
        if (rt.samples, label) != self._samples or not rt.samples:
            self._samples = (rt.samples, label)
            utils = [u for u in rt.util_history if u is not None]
            cpus = list(rt.cpu_history)
            self.query_one("#util", Sparkline).data = utils
            self.query_one("#cpu", Sparkline).data = cpus
            self.query_one("#util-label", Static).update(
                f"GPU util (mean of GPUs), last {len(utils)}"
                + (latest(label, utils[-1]) if utils else "")
            )
            self.query_one("#cpu-label", Static).update(
                f"CPU, last {len(cpus)}" + (latest(label, cpus[-1]) if cpus else "")
            )
        alerts = [f"{f.severity.value.upper()} {f.message}" for f in rt.findings]
        self.query_one("#alerts", Static).update(
            "Alerts: " + ("; ".join(alerts) if alerts else "none")
        )
        events = ctl.timeline.for_host(self.host, HEALTH_KINDS, HISTORY_LINES)
        self.query_one("#health-history", Static).update(event_lines(events) or "(nothing yet)")

    def hosts_for_action(self) -> list[str]:
        return [self.host]


def latest(label: str, value: float) -> str:
    """``: now 95%``, or ``: 95% (38s ago, OLD)`` for a sample too old to be current."""
    return f": now {value:.0f}%" if label == "now" else f": {value:.0f}% ({label})"
