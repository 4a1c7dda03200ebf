"""``hotspare-executor``: run a job on this machine, or serve the protocol for the console.

Exit codes are in ``executors.exitcodes``. Bad input is one line on stderr and exit 2.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
from pathlib import Path
from types import FrameType

from executors import exitcodes
from executors.agent.workdir import EVENTS, PID, WorkdirBusy, acquire, read_command, reap_command
from protocol.errors import ConfigError
from protocol.faults import FaultKind, StopReason
from protocol.messages import ExecutorMessage, LogLevel
from protocol.version import VersionAction

PROG = "hotspare-executor"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="Train a hotspare job on this host.")
    p.add_argument("--version", action=VersionAction, line=_version_line)
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser(
        "run", help="run a job to its last step, resuming from the newest valid checkpoint"
    )
    run.add_argument(
        "--spec", type=Path, required=True, help="job spec TOML, or an inventory with [jobs.NAME]"
    )
    run.add_argument("--job", help="which job of an inventory")
    run.add_argument(
        "--workdir", type=Path, required=True, help="folder for checkpoints and events"
    )
    run.add_argument(
        "--json", action="store_true", help="one JSON object per line per event on stdout"
    )
    run.add_argument("--device", help="torch device (default: cuda if available, else cpu)")
    run.add_argument("--epoch", type=int, default=0, help=argparse.SUPPRESS)
    serve = sub.add_parser(
        "serve", help="serve the protocol on a Unix socket in the workdir (console mode)"
    )
    serve.add_argument("--workdir", type=Path, required=True)
    serve.add_argument(
        "--spec", type=Path, help="start this job at once instead of waiting for Start"
    )
    serve.add_argument("--job")
    serve.add_argument("--device")
    serve.add_argument(
        "--kind",
        default="torch",
        help="the kind of job expected; only torch is warmed up (imported) while idle",
    )
    serve.add_argument(
        "--twin",
        action="store_true",
        help="wait as the job's warm twin (twin.sock): on Start, take over from an executor "
        "that is gone",
    )
    serve.add_argument("--heartbeat-s", type=float, default=1.0)
    serve.add_argument("--health-s", type=float, default=1.0)
    serve.add_argument(
        "--idle-exit-s",
        type=float,
        default=600.0,
        help="exit when no job was started and no console was connected for this long",
    )
    health = sub.add_parser(
        "health",
        help="print one health sample of this host and exit (imports no torch: cheap on a spare)",
    )
    health.add_argument(
        "--workdir", type=Path, required=True, help="the folder whose disk is measured"
    )
    health.add_argument(
        "--json", action="store_true", help="the sample as one JSON Health message on stdout"
    )
    health.add_argument(
        "--window-s",
        type=float,
        default=0.25,
        help="CPU and I/O rates are measured over this long (default 0.25)",
    )
    sub.add_parser("version", help="print the executor's code version")
    return p


def _version_line() -> str:
    from executors.checkpoints.version import code_version

    return f"{PROG} {code_version()}"


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "version":
            from executors.checkpoints.version import code_version

            print(code_version())
            return exitcodes.OK
        if args.command == "health":
            return _health(args)
        if args.command == "run":
            return _run(args)
        return _serve(args)
    except ConfigError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return exitcodes.CONFIG
    except WorkdirBusy as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return exitcodes.BUSY


def _run(args: argparse.Namespace) -> int:
    from executors.agent.control import Control
    from executors.agent.events import EventLog, JsonLines, ProgressBar, report_crash
    from executors.agent.inject import Injections
    from executors.agent.spec import load_spec
    from executors.kinds import load_kind
    from protocol.workloads import check_workload

    spec = load_spec(args.spec, args.job)
    check_workload(spec.executor, spec.workload, spec.config)  # before the kind imports torch
    injections = Injections.from_env()
    kind = load_kind(spec.executor)
    acquire(args.workdir)
    _reap(args.workdir)
    log = EventLog(args.workdir / EVENTS)
    show = JsonLines(sys.stdout) if args.json else ProgressBar(sys.stderr)

    def emit(msg: ExecutorMessage) -> None:
        log(msg)
        show(msg)

    control = Control(epoch=args.epoch)

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        if signum == signal.SIGTERM:
            control.request_stop(
                StopReason.PREEMPTED,
                checkpoint=True,
                exit_code=exitcodes.PREEMPTED,
                fault=FaultKind.PREEMPTED,
            )
        else:
            control.request_stop(
                StopReason.INTERRUPTED, checkpoint=True, exit_code=exitcodes.INTERRUPTED
            )

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    runner = kind.runner(
        spec, args.workdir, emit, control=control, device=args.device, injections=injections
    )
    try:
        return runner.run().exit_code
    except ConfigError:
        raise
    except Exception as e:  # noqa: BLE001 - a workload crash: one line here, the traceback in the workdir
        return report_crash(e, args.workdir, emit)
    finally:
        (args.workdir / PID).unlink(missing_ok=True)


def _serve(args: argparse.Namespace) -> int:
    from executors.agent.spec import load_spec

    # A bad spec is refused before the workdir is touched: no lock or pid file names an
    # executor that never ran.
    spec = load_spec(args.spec, args.job) if args.spec else None
    twin = None
    if args.twin:  # a twin holds its own lock; the workdir's only once promoted by a Start
        if spec is not None:
            raise ConfigError("--twin waits for Start; it cannot start a --spec at once")
        from executors.agent.twin import TwinSeat

        twin = TwinSeat.take(args.workdir)
    else:
        # Then the lock, before the slow imports: the console takes a free lock for a dead executor.
        acquire(args.workdir)
        _reap(args.workdir)
    import asyncio

    from executors.agent.serve import Server

    server = Server(
        args.workdir,
        device=args.device,
        heartbeat_s=args.heartbeat_s,
        health_s=args.health_s,
        idle_exit_s=args.idle_exit_s,
        kind=args.kind,
        twin=twin,
    )
    code = asyncio.run(server.main(autostart=spec))
    # Everything is said and closed (events, sockets, the pid file): end the process now, not
    # after the interpreter's teardown (torch's takes a good part of a second), so the lock it
    # holds for its life is free at once for a planned move's reap and the next executor.
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


def _health(args: argparse.Namespace) -> int:
    """One Health sample, the same the executor sends while it serves, without torch: what the
    console runs on a host with no executor (a spare) to watch it, on the host's root (there
    once its bundle is). A workdir that is not there is refused, not measured elsewhere."""
    import time

    from executors.agent.events import to_json
    from executors.health.health import HealthSampler
    from protocol.units import size_mb

    if not 0 <= args.window_s <= 10:
        raise ConfigError(f"--window-s must be between 0 and 10, got {args.window_s:g}")
    if not args.workdir.is_dir():  # a typo would measure whichever disk holds its parent
        what = "is not a folder" if args.workdir.exists() else "no such folder"
        raise ConfigError(f"--workdir {args.workdir}: {what}")
    sampler = HealthSampler(args.workdir)
    try:
        sampler.sample()  # primes the rates: the second sample measures the window
        time.sleep(args.window_s)
        h = sampler.sample()
    finally:
        sampler.close()
    if args.json:
        print(to_json(h).decode())
        return exitcodes.OK
    lost = [str(g.index) for g in h.gpus if g.lost]
    print(
        f"cpu {h.cpu_pct:.0f}%  mem {h.mem_used_pct:.0f}%  "
        f"disk {size_mb(h.disk_free_mb)} free of {size_mb(h.disk_total_mb)}  "
        f"{h.gpu_status}" + (f" (lost: GPU {', '.join(lost)})" if lost else "")
    )
    return exitcodes.OK


def _reap(workdir: Path) -> None:
    """Before anything starts: what a SIGKILLed predecessor's command left running dies
    (CommandLingers, a WorkdirBusy, if it will not), and the kill is an event."""
    rec = read_command(workdir)
    gone = reap_command(workdir)
    if gone and rec is not None:
        from executors.agent.events import EventLog
        from protocol.messages import Log

        text = (
            f"killed {gone} process(es) the previous executor's command left running "
            f"(process group {rec[0]})"
        )
        print(f"{PROG}: {text}", file=sys.stderr)
        log = EventLog(workdir / EVENTS)
        log(Log(level=LogLevel.WARNING, text=text))
        log.close()


if __name__ == "__main__":
    sys.exit(main())
