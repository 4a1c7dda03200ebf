"""The Textual operator console: a thin view over the controller (its own issue)."""

from __future__ import annotations

import sys

from console.inventory import Inventory
from console.policy import Policy


def run_tui(inv: Inventory, policy: Policy, *, read_only: bool) -> int:
    print(
        "hotspare: the terminal UI is not built yet; `hotspare run --policy auto` runs the inventory's jobs "
        "headless and `hotspare check` preflights its hosts.",
        file=sys.stderr,
    )
    return 2
