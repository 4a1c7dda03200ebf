"""Jobs: where each job runs, where it would go, and how far it has got."""

from __future__ import annotations

from textual.binding import Binding

from console.ui.screens.base import ViewScreen
from console.ui.view import JOB_COLUMNS, Row, job_rows


class JobsScreen(ViewScreen):
    TITLE_TEXT = "Jobs"
    COLUMNS = JOB_COLUMNS
    BINDINGS = [
        Binding("f", "fail_over", "fail over", id="jobs.fail_over"),
        Binding("a", "approve", "approve", id="jobs.approve"),
        Binding("x", "deny", "deny", id="jobs.deny"),
        Binding("c", "checkpoint", "checkpoint now", id="jobs.checkpoint"),
        Binding("s", "stop", "stop", id="jobs.stop"),
    ]

    def rows(self) -> dict[str, Row]:
        return job_rows(self.ctl)

    def _job(self) -> str | None:
        job = self.table.selected
        if job is None:
            self.notify("no job selected", severity="warning")
        return job

    def action_fail_over(self) -> None:
        if job := self._job():
            self.act(
                f"fail over {job}",
                lambda: self.ctl.fail_over(job),
                confirm=f"Fail {job} over to its best spare now?",
            )

    def action_approve(self) -> None:
        if job := self._job():
            self.act(f"approve failover of {job}", lambda: self._answer(job, True))

    def action_deny(self) -> None:
        if job := self._job():
            self.act(
                f"deny failover of {job}",
                lambda: self._answer(job, False),
                confirm=f"Deny the pending failover of {job}?",
            )

    def _answer(self, job: str, yes: bool) -> None:
        answered = self.ctl.approve(job) if yes else self.ctl.deny(job)
        if not answered:
            self.notify(f"{job} has no failover waiting for approval", severity="warning")

    def action_checkpoint(self) -> None:
        if job := self._job():
            self.act(f"checkpoint {job}", lambda: self.ctl.checkpoint_now(job))

    def action_stop(self) -> None:
        if job := self._job():
            self.act(
                f"stop {job}",
                lambda: self.ctl.stop_job(job),
                confirm=f"Stop {job}? It checkpoints and its executor exits.",
            )
