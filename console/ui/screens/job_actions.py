"""The job actions, shared by the Jobs list (cursor or tagged rows) and a job's detail screen."""

from __future__ import annotations

from textual.binding import Binding

from console.ui.actions import JOB_ACTIONS
from console.ui.screens.base import LiveScreen
from console.ui.screens.choose import ChooseHostScreen
from console.ui.targets import failover_targets

JOB_BINDINGS = [
    Binding("f", "job('fail_over')", "fail over", id="jobs.fail_over"),
    Binding("t", "fail_over_to", "fail over to...", id="jobs.fail_over_to"),
    Binding("a", "job('approve')", "approve", id="jobs.approve"),
    Binding("x", "job('deny')", "deny", id="jobs.deny"),
    Binding("c", "job('checkpoint')", "checkpoint now", id="jobs.checkpoint"),
    Binding("s", "job('stop')", "stop", id="jobs.stop"),
    Binding("g", "job('start')", "start", id="jobs.start"),
]


class JobActions(LiveScreen):
    NOUN = "job"

    def jobs_for_action(self) -> list[str]:
        """The jobs an action applies to (empty, with a note, if none)."""
        raise NotImplementedError

    def action_job(self, name: str) -> None:
        self.perform(JOB_ACTIONS[name], self.jobs_for_action())

    def action_fail_over_to(self) -> None:
        jobs = self.jobs_for_action()
        if not jobs:
            return
        job = jobs[0]
        targets = failover_targets(self.ctl, job)
        if not targets:
            self.notify(f"no usable host to move {job} to", severity="warning", markup=False)
            return

        def chosen(host: str | None) -> None:
            if host:
                self.hotspare.fail_over_to(job, host)

        self.app.push_screen(ChooseHostScreen(f"Move {job} to which host?", targets), chosen)
