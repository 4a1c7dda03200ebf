"""``hotspare run``: every job in the inventory to completion, with no one at the keyboard.

Prints the journal as it is written (human lines, or JSON with ``--json``). Exits 0 when
every job finished clean, 1 with the reasons when one did not finish, 4 when every job
finished but one not clean (no checkpoint was ever taken, or no params digest: a fault would
have restarted it from step 0), 130 when interrupted (executors keep training until their
lease ends; a console started again reattaches).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from typing import TextIO

import msgspec

from console.inventory import Inventory
from console.records.journal import Event
from console.records.report import not_clean
from console.service.control import ControlServer, Standing
from console.service.standby import DEPOSED, LostLead, lead, open_controller, take_state_dir
from console.states import JobState
from console.supervise.policy import Policy

NOT_CLEAN = 4
"""``hotspare run``'s exit when every job finished but one not clean."""

ENV_HOOK = "HOTSPARE_EXECUTOR_ENV"
"""Test hook: JSON ``{host: {VAR: value}}`` added to executors' environment on that host."""


def event_line(e: Event) -> str:
    return f"{time.strftime('%H:%M:%S', time.localtime(e.t))}  {e.msg}"


def run_headless(
    inv: Inventory, policy: Policy, *, as_json: bool, out: TextIO | None = None
) -> int:
    """``out``: default the ``sys.stdout`` of the call, not of the import."""
    out = sys.stdout if out is None else out
    env = json.loads(os.environ.get(ENV_HOOK, "{}"))

    def show(e: Event) -> None:
        out.write((msgspec.json.encode(e).decode() if as_json else event_line(e)) + "\n")
        out.flush()

    async def main() -> tuple[dict[str, str], dict[str, list[str]]]:
        """Run the controller; returns the reason of each job that did not finish, and the
        warnings of each that finished not clean."""
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, task.cancel)
        lock = take_state_dir(inv)
        standing = Standing(policy.value)
        server = ControlServer(inv.state_dir, standing, stop=lambda: loop.call_soon(task.cancel))

        def say(why: str) -> None:
            standing.why = why
            print(f"hotspare: {why}", file=out, flush=True)

        try:
            await server.start()  # views and `hotspare stop` reach a standby too
            ctl, leadership = await open_controller(
                inv, policy, lock=lock, executor_env=env, say=say
            )
        except BaseException:
            await server.close()
            raise
        ctl.journal.subscribe(show)
        server.serve(ctl)
        try:
            await lead(ctl, leadership, ctl.run())
            unfinished = {n: s.why for n, s in ctl.jobs.items() if s.state is not JobState.FINISHED}
            dirty = {
                n: s.rec.finished_warnings
                for n, s in ctl.jobs.items()
                if s.state is JobState.FINISHED and s.rec.finished_warnings
            }
            return unfinished, dirty
        finally:
            await server.close()
            await ctl.close()
            if leadership is not None and leadership.deposed is None:
                await leadership.resign()

    try:
        unfinished, dirty = asyncio.run(main())
    except asyncio.CancelledError:
        print(
            "hotspare: interrupted; executors keep training until their lease ends", file=sys.stderr
        )
        return 130
    except LostLead as e:
        print(f"hotspare: {e}; ended (started again, it stands by)", file=sys.stderr, flush=True)
        return DEPOSED
    for name, why in unfinished.items():
        print(f"hotspare: job {name} did not finish: {why}", file=sys.stderr)
    for name, warnings in dirty.items():
        print(f"hotspare: job {name} finished, {not_clean(warnings)}", file=sys.stderr)
    return 1 if unfinished else NOT_CLEAN if dirty else 0


__all__ = ["ENV_HOOK", "NOT_CLEAN", "event_line", "run_headless"]
