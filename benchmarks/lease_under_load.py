"""Lease margin under load: how much was left on a running executor's lease when each renewal
landed, with 0, 2 and 4 CPU-burning processes beside the console and the executor.

One local host on this machine runs a small torch job (the tests' model, checkpoints every 20
steps); the busy loops (``python -c 'while True: pass'``) start before the console, so the
executor's start, its torch import and its first lease are under load too. The margin is
what the executor measures where the lease is enforced: each Heartbeat's ``lease_low_s``, the
least time left when a renewal landed since the heartbeat before (read by a second client on
the executor's socket, as a view would), so where two renewals land between heartbeats only
the closer one counts. A renewal that lands with less than half the lease left is one after
which a command job may already have stopped (its guard stops it at up to half the lease
left); a lease_lost stop is a healthy job restarted for nothing.

Two settings: the shipped defaults (``ConsoleSettings``: lease 10 s, heartbeat 1 s) and the
tests' short lease (``tests/fleetbed.py``: lease 3 s, heartbeat 0.25 s).

    python benchmarks/lease_under_load.py [--seconds 40] [--burners 0,2,4]
        [--settings defaults,tests] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import posixpath
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "benchmarks")]

from common import Figure, emit  # noqa: E402
from support.fleetbed import (  # noqa: E402
    EXECUTOR_ENV,
    FAST_CONSOLE,
    job_table,
    local_host,
    until,
    write_inventory,
)

from console import clock, loop_watch  # noqa: E402
from console.controller import Controller  # noqa: E402
from console.fleet.link import ExecutorLink, LinkError  # noqa: E402
from console.inventory import ConsoleSettings, load  # noqa: E402
from console.reach.deploy import job_dir  # noqa: E402
from console.records.incidents import incidents  # noqa: E402
from console.records.journal import Kind, read  # noqa: E402
from console.states import JobState  # noqa: E402
from console.supervise.policy import Policy  # noqa: E402
from protocol.messages import Heartbeat  # noqa: E402

SHORTENED = tuple(k for k in FAST_CONSOLE if k != "unattended_s")
"""The console settings the tests shorten; ``defaults`` puts each back."""


def settings(name: str) -> dict[str, float]:
    if name == "tests":
        return {}  # write_inventory's own: the tests' fleet
    shipped = ConsoleSettings()
    return {k: getattr(shipped, k) for k in SHORTENED}


def quantile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * (len(s) - 1)))] if s else float("nan")


async def observe(
    link_of: ExecutorLink, lows: list[float], gaps: list[float], end: float, noted_s: float
) -> None:
    """Read heartbeats from the job's executor (a new one after a restart) until ``end``:
    each ``lease_low_s``, and the gaps between heartbeats' clock readings (the executor's own
    stalls: its loop sends one every ``heartbeat_s``). A landing with less than ``noted_s``
    left is printed with when it happened."""
    start = clock.mono()
    while time.monotonic() < end:
        link = ExecutorLink(link_of.transport, link_of.socket_path, "lease-under-load")
        try:
            await link.open(timeout=2)
        except LinkError:
            await asyncio.sleep(0.1)
            continue

        def on(msg: object, last: list[float] = []) -> None:  # noqa: B006 - this link's last reading
            if not isinstance(msg, Heartbeat) or msg.nonce is not None:
                return
            if last:
                gaps.append(msg.clock - last[0])
            last[:] = [msg.clock]
            if msg.lease_low_s is not None:
                lows.append(msg.lease_low_s)
                if msg.lease_low_s < noted_s:
                    print(
                        f"  low: {msg.lease_low_s:.2f} s left at a landing, {msg.clock - start:.1f} s"
                        f" into the run, heartbeat {gaps[-1] if gaps else 0:.2f} s after the one before",
                        file=sys.stderr,
                    )

        pump = asyncio.create_task(link.pump(on))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(pump), max(0.0, end - time.monotonic()))
        link.close()
        await asyncio.gather(pump, return_exceptions=True)


async def run_one(folder: Path, console: dict[str, float], seconds: float) -> dict[str, float]:
    inv = write_inventory(
        folder / "inventory.toml",
        hosts={"a": local_host(folder / "a"), "b": local_host(folder / "b", role="spare")},
        jobs={"j": {"host": "a", "spares": ["b"], **job_table(steps=100_000_000)}},
        **console,
    )
    loaded = load(inv)
    lease_s = loaded.console.lease_s
    ctl = Controller(loaded, Policy.AUTO, executor_env={h: dict(EXECUTOR_ENV) for h in "ab"})
    sup = ctl.jobs["j"]
    watch = loop_watch.for_loop()
    began = time.monotonic()
    task = asyncio.create_task(ctl.run())
    lows: list[float] = []
    gaps: list[float] = []
    sock = posixpath.join(job_dir(str(folder / "a"), "j"), "executor.sock")
    probe = ExecutorLink(ctl.fleet.hosts["a"].transport, sock)
    end = began + seconds
    observer = asyncio.create_task(observe(probe, lows, gaps, end, lease_s / 2))
    try:
        await until(lambda: sup.state is JobState.RUNNING or task.done(), 300, "running")
        await asyncio.sleep(max(0.0, end - time.monotonic()))
        await observer
    finally:
        ctl.stop_job("j")
        await asyncio.wait_for(task, 120)
        await ctl.close()
    stall = watch.stall(began)
    journal = list(read(inv.parent / "state" / "journal.jsonl"))
    lost = sum(
        1 for e in journal if e.kind == Kind.FAULT and (e.data or {}).get("fault") == "lease_lost"
    )
    return {
        "n": float(len(lows)),
        "min": min(lows, default=float("nan")),
        "p1": quantile(lows, 0.01),
        "p50": quantile(lows, 0.5),
        "below_half": float(sum(1 for x in lows if x < lease_s / 2)),
        "lease_lost": float(lost),
        "incidents": float(len(incidents(journal))),
        "stall": stall,
        "gap": max(gaps, default=float("nan")),
        "lease_s": lease_s,
    }


def burn(n: int) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=40.0, help="per run, from the console start")
    ap.add_argument("--burners", default="0,2,4", help="busy loops beside it, per run")
    ap.add_argument("--settings", default="defaults,tests", help="defaults and/or tests")
    ap.add_argument("--json", action="store_true", help="also print one JSON line last")
    args = ap.parse_args()
    figures: list[Figure] = []
    for name in args.settings.split(","):
        for n in (int(b) for b in args.burners.split(",")):
            burners = burn(n)
            try:
                with tempfile.TemporaryDirectory(prefix="lul-", dir="/tmp") as d:
                    r = asyncio.run(run_one(Path(d), settings(name), args.seconds))
            finally:
                for p in burners:
                    p.kill()
                    p.wait()
            print(
                f"{name} ({r['lease_s']:g} s lease), {n} burners: {r['n']:.0f} renewals seen, "
                f"margin min {r['min']:.2f} p1 {r['p1']:.2f} p50 {r['p50']:.2f} s, "
                f"{r['below_half']:.0f} below half the lease, {r['lease_lost']:.0f} lease_lost, "
                f"{r['incidents']:.0f} incidents, "
                f"console loop stalled {r['stall']:.2f} s at most, heartbeats at most "
                f"{r['gap']:.2f} s apart",
                file=sys.stderr,
            )
            tag = f"{name}, {n} burners"
            half = r["lease_s"] / 2
            figures += [
                Figure(f"margin min ({tag})", r["min"], "s", f"> {half:g} s", r["min"] > half),
                Figure(f"margin p1 ({tag})", r["p1"], "s"),
                Figure(f"margin p50 ({tag})", r["p50"], "s"),
                Figure(
                    f"below half the lease ({tag})",
                    r["below_half"],
                    "renewals",
                    "0",
                    r["below_half"] == 0,
                ),
                Figure(f"lease_lost stops ({tag})", r["lease_lost"], "", "0", r["lease_lost"] == 0),
                Figure(f"incidents ({tag})", r["incidents"], "", "0", r["incidents"] == 0),
                Figure(f"console loop stall max ({tag})", r["stall"], "s"),
                Figure(f"executor heartbeat gap max ({tag})", r["gap"], "s"),
            ]
    notes = (
        f"{platform.machine()}, {os.cpu_count()} CPUs; one local host, torch job (tests' model, "
        f"checkpoint every 20 steps), {args.seconds:g} s per run; margin: time left on the "
        "executor's lease when a renewal landed (Heartbeat.lease_low_s)"
    )
    emit("lease_under_load", figures, notes, args.json)


if __name__ == "__main__":
    main()
