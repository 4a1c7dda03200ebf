"""The Textual operator console: a thin view over the controller (its own issue)."""

from __future__ import annotations

import sys

from console.inventory import Inventory
from console.jobs.policy import Policy


def run_tui(inv: Inventory, policy: Policy, *, read_only: bool) -> int:
    """Open the console on ``inv``; quitting leaves the executors training."""
    from console.jobs.controller import Controller
    from console.ui.app import QUIT_NOTE, HotspareApp

    ctl = Controller(inv, policy, read_only=read_only)
    HotspareApp(ctl, freeze_startup=True).run()
    print(f"hotspare: {QUIT_NOTE}", file=sys.stderr)
    return 0
