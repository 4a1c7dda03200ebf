"""The command palette (`:` or ctrl+p): every action on every job and host, by name."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial
from typing import TYPE_CHECKING, cast

from textual.command import DiscoveryHit, Hit, Hits, Provider

from console.states import HostState, JobState
from console.ui.screens.choose import failover_targets

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
        for mode in app.MODES:
            yield f"view {mode}", f"switch to the {mode} view", partial(app.switch_mode, mode)
        yield "add host", "append a host to the inventory", app.action_add_host
        for job, sup in ctl.jobs.items():
            yield (
                f"open job {job}",
                "curves, checkpoints, log, incidents",
                partial(app.open_job, job),
            )
            if sup.state.is_terminal():
                if sup.state is not JobState.FINISHED:
                    yield (
                        f"start {job}",
                        "start it again from its newest checkpoint",
                        partial(app.act, f"start {job}", partial(ctl.start_job, job)),
                    )
                continue
            yield (
                f"fail over {job}",
                "move it to its best spare now",
                partial(
                    app.act,
                    f"fail over {job}",
                    partial(ctl.fail_over, job),
                    confirm=f"Fail {job} over to its best spare now?",
                ),
            )
            for host, what in failover_targets(ctl, job):
                yield (
                    f"fail over {job} to {host}",
                    what,
                    partial(
                        app.act,
                        f"fail over {job} to {host}",
                        partial(ctl.fail_over, job, host),
                        confirm=f"Fail {job} over to {host} now?",
                    ),
                )
            yield (
                f"checkpoint {job}",
                "checkpoint now",
                partial(app.act, f"checkpoint {job}", partial(ctl.checkpoint_now, job)),
            )
            yield (
                f"approve failover of {job}",
                "manual policy",
                partial(app.act, f"approve failover of {job}", partial(ctl.approve, job)),
            )
            yield (
                f"deny failover of {job}",
                "manual policy",
                partial(
                    app.act,
                    f"deny failover of {job}",
                    partial(ctl.deny, job),
                    confirm=f"Deny the pending failover of {job}?",
                ),
            )
            yield (
                f"stop {job}",
                "checkpoint, then its executor exits",
                partial(app.act, f"stop {job}", partial(ctl.stop_job, job), confirm=f"Stop {job}?"),
            )
        for host, rt in ctl.fleet.hosts.items():
            yield f"open host {host}", "GPU counters, health history", partial(app.open_host, host)
            yield (
                f"drain {host}",
                "move its jobs off with 0 lost steps",
                partial(
                    app.act,
                    f"drain {host}",
                    partial(ctl.drain_host, host),
                    confirm=f"Drain {host}?",
                ),
            )
            if rt.state is HostState.CORDONED:
                yield (
                    f"uncordon {host}",
                    "take jobs again",
                    partial(app.act, f"uncordon {host}", partial(ctl.uncordon, host)),
                )
            else:
                yield (
                    f"cordon {host}",
                    "keep its jobs, take no new ones",
                    partial(app.act, f"cordon {host}", partial(ctl.cordon, host)),
                )
            if ctl.inv.hosts[host].transport == "local":
                yield (
                    f"kill {host}",
                    "demo: SIGKILL its executors, unreachable",
                    partial(
                        app.act,
                        f"kill {host}",
                        partial(ctl.kill_host, host),
                        confirm=f"Kill demo host {host}?",
                    ),
                )
                yield (
                    f"revive {host}",
                    "demo: bring it back",
                    partial(app.act, f"revive {host}", partial(ctl.revive_host, host)),
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
