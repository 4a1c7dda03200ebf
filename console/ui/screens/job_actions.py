"""The job actions, shared by the Jobs list (cursor or tagged rows) and a job's detail screen."""

from __future__ import annotations

from textual.binding import Binding

from console.ui.screens.base import LiveScreen
from console.ui.screens.choose import ChooseHostScreen, failover_targets

JOB_BINDINGS = [
    Binding("f", "fail_over", "fail over", id="jobs.fail_over"),
    Binding("t", "fail_over_to", "fail over to...", id="jobs.fail_over_to"),
    Binding("a", "approve", "approve", id="jobs.approve"),
    Binding("x", "deny", "deny", id="jobs.deny"),
    Binding("c", "checkpoint", "checkpoint now", id="jobs.checkpoint"),
    Binding("s", "stop", "stop", id="jobs.stop"),
    Binding("g", "start", "start", id="jobs.start"),
]


class JobActions(LiveScreen):
    NOUN = "job"

    def jobs_for_action(self) -> list[str]:
        """The jobs an action applies to (empty, with a note, if none)."""
        raise NotImplementedError

    def action_fail_over(self) -> None:
        if jobs := self.jobs_for_action():
            self.act_on_each(
                "fail over", jobs, self.ctl.fail_over, confirm="Fail {} over to the best spare now?"
            )

    def action_fail_over_to(self) -> None:
        jobs = self.jobs_for_action()
        if not jobs:
            return
        job = jobs[0]
        targets = failover_targets(self.ctl, job)
        if not targets:
            self.notify(f"no usable host to move {job} to", severity="warning")
            return

        def chosen(host: str | None) -> None:
            if host:
                self.act(
                    f"fail over {job} to {host}",
                    lambda: self.ctl.fail_over(job, host),
                    confirm=f"Fail {job} over to {host} now?",
                )

        self.app.push_screen(ChooseHostScreen(f"Move {job} to which host?", targets), chosen)

    def action_approve(self) -> None:
        if jobs := self.jobs_for_action():
            self.act_on_each("approve failover of", jobs, lambda j: self._answer(j, True))

    def action_deny(self) -> None:
        if jobs := self.jobs_for_action():
            self.act_on_each(
                "deny failover of",
                jobs,
                lambda j: self._answer(j, False),
                confirm="Deny the pending failover of {}?",
            )

    def _answer(self, job: str, yes: bool) -> None:
        answered = self.ctl.approve(job) if yes else self.ctl.deny(job)
        if not answered:
            self.notify(f"{job} has no failover waiting for approval", severity="warning")

    def action_checkpoint(self) -> None:
        if jobs := self.jobs_for_action():
            self.act_on_each("checkpoint", jobs, self.ctl.checkpoint_now)

    def action_stop(self) -> None:
        if jobs := self.jobs_for_action():
            self.act_on_each(
                "stop",
                jobs,
                self.ctl.stop_job,
                confirm="Stop {}? It checkpoints and its executor exits.",
            )

    def action_start(self) -> None:
        if jobs := self.jobs_for_action():
            self.act_on_each("start", jobs, self.ctl.start_job)
