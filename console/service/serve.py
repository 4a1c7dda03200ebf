"""``hotspare serve``: the controller as a long-lived service, until ``hotspare stop``.

It supervises every job as ``hotspare run`` does, but stays when they end (jobs can be started
again, hosts added), serves the control socket, and prints the journal as it is written. A
view attaching or leaving changes nothing for training. SIGTERM, SIGINT, SIGHUP and ``hotspare
stop`` close it cleanly (its last leases, ``console stopped``); SIGKILL leaves the executors
training until their lease ends, and a controller started again within it reattaches.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from typing import TextIO

import msgspec

from console.headless import ENV_HOOK, event_line
from console.inventory import Inventory
from console.jobs.controller import Controller
from console.jobs.policy import Policy
from console.records.journal import Event
from console.service.control import ControlServer


def run_service(
    inv: Inventory, policy: Policy, *, as_json: bool = False, out: TextIO | None = None
) -> int:
    out = sys.stdout if out is None else out
    env = json.loads(os.environ.get(ENV_HOOK, "{}"))

    def show(e: Event) -> None:
        out.write((msgspec.json.encode(e).decode() if as_json else event_line(e)) + "\n")
        out.flush()

    async def main() -> None:
        ctl = Controller(inv, policy, executor_env=env)
        ctl.journal.subscribe(show)
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            loop.add_signal_handler(sig, task.cancel)
        server = ControlServer(inv.state_dir, ctl, stop=lambda: loop.call_soon(task.cancel))
        try:
            await server.start()
            await ctl.run(stay=True)
        finally:
            await server.close()
            await ctl.close()

    try:
        asyncio.run(main())
    except asyncio.CancelledError:
        print("hotspare: controller stopped", file=out, flush=True)
    return 0


__all__ = ["run_service"]
