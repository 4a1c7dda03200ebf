"""``hotspare``: the operator console (the TUI and headless modes land with the fleet controller)."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    print(
        "hotspare: the console is not built yet; run a job on this machine with\n"
        "  hotspare-executor run --spec inventory.toml --job demo --workdir .hotspare/demo",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main())
