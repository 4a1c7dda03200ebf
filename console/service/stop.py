"""``hotspare stop``: end the controller that holds a state dir, cleanly, and say when it has.

The controller closes as a quitting console does: each executor gets a last lease of
``console.unattended_s`` (persisted), then the journal records ``console stopped``. Done is
when the kernel says the state dir's lock is free, not when the controller says it will go.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from console.records.console_lock import held
from console.service.client import ControllerGone, Remote

STOP_S = 60.0
"""The most ``stop`` waits for the controller to let go of the state dir."""


def stop_controller(state_dir: Path, *, timeout: float = STOP_S) -> int:
    """0 once the controller has let go; 1 if none ran, none answers, or it outlasts ``timeout``."""
    if not held(state_dir):
        print(f"hotspare: no controller holds {state_dir}; nothing to stop", file=sys.stderr)
        return 1
    remote = Remote(state_dir)
    try:
        pid = remote.hello().get("pid")
        remote.stop()
    except ControllerGone as e:
        print(f"hotspare: {e}; nothing stopped", file=sys.stderr)
        return 1
    finally:
        remote.close()
    deadline = time.monotonic() + timeout
    while held(state_dir):
        if time.monotonic() > deadline:
            print(
                f"hotspare: controller pid {pid} still holds {state_dir} after {timeout:g} s",
                file=sys.stderr,
            )
            return 1
        time.sleep(0.05)
    print(
        f"hotspare: controller pid {pid} stopped; its executors train on until their last "
        "lease (console.unattended_s) ends, and a controller started within it reattaches",
        file=sys.stderr,
    )
    return 0


__all__ = ["stop_controller"]
