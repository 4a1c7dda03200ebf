"""``hotspare``: the operator console.

``hotspare check`` validates the inventory and preflights every host. The terminal UI and
the headless runner land with the fleet controller.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from protocol.errors import ConfigError

PROG = "hotspare"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG, description="Keep PyTorch training alive on hosts that fail."
    )
    p.add_argument(
        "--inventory", type=Path, default=Path("inventory.toml"), help="default ./inventory.toml"
    )
    sub = p.add_subparsers(dest="command")
    check = sub.add_parser(
        "check", help="validate the inventory, reach every host and preflight it"
    )
    check.add_argument("--inventory", type=Path, default=argparse.SUPPRESS)
    check.add_argument("--json", action="store_true", help="print the results as JSON")
    check.add_argument("--deploy", action="store_true", help="deploy the executor bundle first")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from console.inventory import load

    try:
        inv = load(args.inventory)
        if args.command == "check":
            from console.check import run_check

            return run_check(inv, as_json=args.json, do_deploy=args.deploy)
    except ConfigError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    print(
        f"{PROG}: the console UI is not built yet; `hotspare check` preflights the inventory's hosts, and\n"
        "  hotspare-executor run --spec inventory.toml --job demo --workdir .hotspare/demo\n"
        "trains the demo job on this machine.",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main())
