"""``hotspare``: the operator console.

    hotspare [--inventory F] [--policy manual|auto|observe] [--read-only]   the terminal UI
    hotspare --attach [USER@]HOST:/STATE_DIR [--identity K] [--known-hosts F]
                                                 the terminal UI on another machine's controller
    hotspare run [--inventory F] [--policy P] [--json]                      headless, to completion
    hotspare serve [--inventory F] [--policy P] [--json]                    the controller, until stopped
    hotspare stop [--inventory F]                                           end the running controller
    hotspare check [--inventory F] [--json] [--deploy]                      preflight every host
    hotspare report [--json] [--inventory F | --state-dir D]                post-mortem (markdown)
    hotspare lineage JOB [--json] [--inventory F | --state-dir D]           a job's checkpoints

The terminal UI is a view: it attaches to the controller that holds the state dir (``serve``,
``run``, or one it started detached when none ran), and quitting it leaves training alone.
With ``--attach`` it attaches over SSH to a controller on another machine (its control socket
forwarded, its state files mirrored), and watches the hosts from here with this inventory.

``--policy`` may come before or after ``run`` or ``serve`` (two that differ are refused); none
given, ``run`` acts (auto) and the terminal UI and ``serve`` ask (manual).

Bad input is one line on stderr and exit 2, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING

from protocol.errors import ConfigError
from protocol.version import VersionAction

if TYPE_CHECKING:
    from console.inventory import Inventory
    from console.supervise.policy import Policy
    from console.ui import Attach

PROG = "hotspare"
POLICIES = ("manual", "auto", "observe")


def _inventory_option(default: object) -> argparse.ArgumentParser:
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument("--inventory", type=Path, default=default, help="default ./inventory.toml")
    return parent


def _version_line() -> str:
    """``hotspare VERSION+HASH``: the installed distribution's version and the hash of the
    executor bundle this console deploys (what every checkpoint manifest records)."""
    from importlib.metadata import PackageNotFoundError, version

    from console.reach.deploy import build_bundle

    try:
        release = version(PROG)
    except PackageNotFoundError:
        release = "unknown"
    return f"{PROG} {release}+{build_bundle().hash}"


STATE_DIR_HELP = (
    "read this state dir instead of the inventory's; given again, every one is read as one "
    "timeline (standby controllers journal in a state dir each)"
)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Keep PyTorch training alive on hosts that fail.",
        parents=[_inventory_option(Path("inventory.toml"))],
    )
    p.add_argument(
        "--policy",
        choices=POLICIES,
        help="who acts on a failure (default: manual: failovers wait for an operator; `run`: auto)",
    )
    p.add_argument("--read-only", action="store_true", help="turn every action off")
    p.add_argument(
        "--attach",
        metavar="[USER@]HOST:/STATE_DIR",
        help="open the view on the controller running on another machine, over SSH "
        "(also ssh://[USER@]HOST[:PORT]/STATE_DIR)",
    )
    p.add_argument("--identity", metavar="FILE", help="--attach: the SSH key (default: agent)")
    p.add_argument(
        "--known-hosts",
        metavar="FILE",
        help="--attach: the known_hosts that lists the controller's machine "
        "(default ~/.ssh/known_hosts; host keys are always checked)",
    )
    p.add_argument("--version", action=VersionAction, line=_version_line)
    sub = p.add_subparsers(dest="command")
    inv = _inventory_option(argparse.SUPPRESS)  # given before or after the subcommand
    run = sub.add_parser("run", parents=[inv], help="run every job to completion, headless")
    run.add_argument(
        "--policy",
        dest="run_policy",
        choices=POLICIES,
        help="who acts on a failure (default: auto); the same as --policy before `run`",
    )
    run.add_argument("--json", action="store_true", help="one JSON event per line")
    serve = sub.add_parser(
        "serve",
        parents=[inv],
        help="run the controller as a service until `hotspare stop`; views attach to it",
    )
    serve.add_argument(
        "--policy",
        dest="run_policy",
        choices=POLICIES,
        help="who acts on a failure (default: manual); the same as --policy before `serve`",
    )
    serve.add_argument("--json", action="store_true", help="one JSON event per line")
    sub.add_parser(
        "stop",
        parents=[inv],
        help="end the controller that holds the state dir (cleanly: its last leases)",
    )
    check = sub.add_parser(
        "check", parents=[inv], help="validate the inventory, reach every host and preflight it"
    )
    check.add_argument(
        "--json",
        action="store_true",
        help='one JSON object, on success and on error alike: {"ok": bool, "error": '
        'null or the line that stopped the check, "hosts": [one object per host]}',
    )
    check.add_argument("--deploy", action="store_true", help="deploy the executor bundle first")
    report = sub.add_parser(
        "report", parents=[inv], help="write a post-mortem of the journal as markdown"
    )
    report.add_argument("--state-dir", type=Path, action="append", help=STATE_DIR_HELP)
    report.add_argument("--json", action="store_true", help="print the report as JSON")
    lineage = sub.add_parser(
        "lineage",
        parents=[inv],
        help="a job's chain of checkpoints across hosts and epochs, with its incidents",
    )
    lineage.add_argument("job", help="the job's name")
    lineage.add_argument("--json", action="store_true", help="print the chain as JSON")
    lineage.add_argument("--state-dir", type=Path, action="append", help=STATE_DIR_HELP)
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return _dispatch(args)
    except ConfigError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        if args.command == "check" and args.json:  # a script reading stdout learns why too
            from console.reach.check import write_json

            write_json(sys.stdout, [], str(e))
        return 2
    except KeyboardInterrupt:
        return 130


def _dispatch(args: argparse.Namespace) -> int:
    from console.inventory import load

    if args.command == "report":
        return _report(args)
    if args.command == "lineage":
        from console.records.lineage import write_lineage

        return write_lineage(_state_dir(args), args.job, sys.stdout, to_json=args.json)
    policy = _policy(args)
    if args.command is not None and (args.attach or args.identity or args.known_hosts):
        raise ConfigError(
            f"--attach, --identity and --known-hosts are for the view, not `{args.command}`"
        )
    if args.attach is None and (args.identity or args.known_hosts):
        raise ConfigError("--identity and --known-hosts go with --attach")
    inv = load(args.inventory)
    if args.command == "check":
        from console.reach.check import run_check

        return run_check(inv, as_json=args.json, do_deploy=args.deploy)
    if args.command == "run":
        from console.headless import run_headless

        return run_headless(inv, policy, as_json=args.json)
    if args.command == "serve":
        from console.service.serve import run_service

        return run_service(inv, policy, as_json=args.json)
    if args.command == "stop":
        from console.service.stop import stop_controller

        return stop_controller(inv.state_dir)
    from console.ui import run_tui

    given = args.policy is not None or getattr(args, "run_policy", None) is not None
    attach = None if args.attach is None else _attach(args, inv)
    return run_tui(inv, policy, read_only=args.read_only, policy_given=given, attach=attach)


def _attach(args: argparse.Namespace, inv: Inventory) -> Attach:
    """``--attach``: where the controller runs, and the SSH target that reaches it."""
    from console.reach.transport.ssh_dial import SshTarget
    from console.service.tunnel import ControllerAt
    from console.ui import Attach

    at = ControllerAt.parse(args.attach)
    for what, path in (("--identity", args.identity), ("--known-hosts", args.known_hosts)):
        if path is not None and not Path(path).is_file():
            raise ConfigError(f"{what} {path}: no such file")
    target = SshTarget(
        name=f"controller {at.host}",
        addresses=[at.host],
        port=at.port,
        user=at.user,
        identity=args.identity,
        known_hosts=args.known_hosts,
        connect_timeout=inv.console.connect_timeout_s,
        keepalive_s=inv.console.keepalive_s,
        command_timeout=inv.console.command_timeout_s,
    )
    return Attach(at, target)


def _policy(args: argparse.Namespace) -> Policy:
    """The policy asked for, before ``run`` or after it (two that disagree are refused);
    none asked for: ``auto`` headless, ``manual`` at a console."""
    from console.supervise.policy import Policy

    before, after = args.policy, getattr(args, "run_policy", None)
    if before is not None and after is not None and before != after:
        raise ConfigError(
            f"--policy {before} before `run` and --policy {after} after it disagree; give one"
        )
    return Policy.parse(after or before or ("auto" if args.command == "run" else "manual"))


def _report(args: argparse.Namespace) -> int:
    """The report needs only the state dir: an inventory that does not load (a typo) is said,
    and the state dir it names, or the default one beside it, is read all the same."""
    from console.records.report import write_report

    return write_report(_state_dir(args), sys.stdout, as_json=args.json)


def _state_dir(args: argparse.Namespace) -> Path | list[Path]:
    """``--state-dir`` (each one given), else the inventory's; an inventory that does not load
    is said, and the state dir it names (or the default one beside it) is read all the same."""
    from console.inventory import load

    if args.state_dir:
        return [Path(d) for d in args.state_dir]
    try:
        return load(args.inventory).state_dir
    except ConfigError as e:
        state_dir = _state_dir_named(args.inventory)
        print(
            f"{PROG}: {e}\n{PROG}: reporting on {state_dir} all the same "
            f"(hotspare {args.command} reads only the journal; --state-dir D reads another)",
            file=sys.stderr,
        )
        return state_dir


def _state_dir_named(inventory: Path) -> Path:
    """The state dir an inventory that does not load names, if it can be read, else the
    default one beside it."""
    from console.inventory import ConsoleSettings

    name = ConsoleSettings().state_dir
    try:
        named = tomllib.loads(inventory.read_text(encoding="utf-8")).get("console", {})
        if isinstance(named, dict) and isinstance(named.get("state_dir"), str):
            name = named["state_dir"]
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        pass
    return (inventory.parent / name).resolve()


if __name__ == "__main__":
    sys.exit(main())
