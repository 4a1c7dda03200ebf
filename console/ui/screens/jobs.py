"""Jobs: where each job runs, where it would go, and how far it has got."""

from __future__ import annotations

from collections.abc import Iterable

from textual.binding import Binding

from console.ui.screens.base import ViewScreen
from console.ui.screens.job_actions import JOB_BINDINGS, JobActions
from console.ui.screens.job_detail import JobDetailScreen
from console.ui.view import JOB_COLUMNS, JOB_WIDTHS, Row, job_marks, job_rows


class JobsScreen(JobActions, ViewScreen):
    TITLE_TEXT = "Jobs"
    LABEL = "Jobs"
    COLUMNS = JOB_COLUMNS
    WIDTHS = JOB_WIDTHS
    NARROW_COLUMNS = ("job", "host -> spare", "state", "progress", "loss", "steps/s")
    BINDINGS = [Binding("enter", "open", "details", id="jobs.open", show=False), *JOB_BINDINGS]

    def rows(self) -> dict[str, Row]:
        return job_rows(self.ctl)

    def marks(self, keys: Iterable[str]) -> dict[str, str]:
        return job_marks(self.ctl, keys)

    def jobs_for_action(self) -> list[str]:
        return self.selected()

    def open(self, key: str) -> None:
        self.app.push_screen(JobDetailScreen(key))
