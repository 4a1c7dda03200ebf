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
from console.records.journal import Event
from console.service.control import ControlServer, Standing
from console.service.standby import DEPOSED, LostLead, lead, open_controller, take_state_dir
from console.supervise.policy import Policy


def run_service(
    inv: Inventory, policy: Policy, *, as_json: bool = False, out: TextIO | None = None
) -> int:
    out = sys.stdout if out is None else out
    env = json.loads(os.environ.get(ENV_HOOK, "{}"))

    def show(e: Event) -> None:
        out.write((msgspec.json.encode(e).decode() if as_json else event_line(e)) + "\n")
        out.flush()

    async def main() -> None:
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
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
            await lead(ctl, leadership, ctl.run(stay=True))
        finally:
            await server.close()
            await ctl.close()
            if leadership is not None and leadership.deposed is None:
                await leadership.resign()

    try:
        asyncio.run(main())
    except asyncio.CancelledError:
        print("hotspare: controller stopped", file=out, flush=True)
    except LostLead as e:
        print(f"hotspare: {e}; ended (started again, it stands by)", file=sys.stderr, flush=True)
        return DEPOSED
    return 0


__all__ = ["run_service"]
