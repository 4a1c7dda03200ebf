"""The command palette (`:` or ctrl+p): every action on every job and host, by name."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial
from typing import TYPE_CHECKING, cast

from textual.command import DiscoveryHit, Hit, Hits, Provider

from console.ui.actions import HOST_ACTIONS, JOB_ACTIONS
from console.ui.targets import failover_targets

if TYPE_CHECKING:
    from console.ui.app import HotspareApp

Command = tuple[str, str, Callable[[], None]]
"""(text to match, help line, what it does)."""


class HotspareCommands(Provider):
    @property
    def hotspare(self) -> HotspareApp:
        return cast("HotspareApp", self.app)

    def commands(self) -> Iterator[Command]:
        app = self.hotspare
        ctl = app.ctl
        for mode in app.VIEWS:
            yield f"view {mode}", f"switch to the {mode} view", partial(app.action_view, mode)
        yield "add host", "append a host to the inventory", app.action_add_host
        if app.attached is not None and app.attached.actions is not None:
            yield (
                "stop the controller",
                "end it cleanly: executors get their last lease (unattended_s)",
                app.stop_controller,
            )
        for job in ctl.jobs:
            yield (
                f"open job {job}",
                "curves, checkpoints, log, incidents",
                partial(app.open_job, job),
            )
            for action in JOB_ACTIONS.values():
                if action.applies(ctl, job):
                    yield (
                        f"{action.verb} {job}",
                        action.help,
                        partial(app.perform, action, [job], "job"),
                    )
            if JOB_ACTIONS["fail_over"].applies(ctl, job):
                for host, what in failover_targets(ctl, job):
                    yield f"fail over {job} to {host}", what, partial(app.fail_over_to, job, host)
        for host in ctl.fleet.hosts:
            yield f"open host {host}", "GPU counters, health history", partial(app.open_host, host)
            for action in HOST_ACTIONS.values():
                if action.applies(ctl, host):
                    yield (
                        f"{action.verb} {host}",
                        action.help,
                        partial(app.perform, action, [host], "host"),
                    )

    async def discover(self) -> Hits:
        for text, help_text, run in self.commands():
            yield DiscoveryHit(text, run, help=help_text)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for text, help_text, run in self.commands():
            score = matcher.match(text)
            if score > 0:
                yield Hit(score, matcher.highlight(text), run, help=help_text)
