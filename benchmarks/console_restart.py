"""A controller SIGKILLed and restarted by its supervisor: does training notice?

``hotspare serve`` runs under a supervisor loop (``while :; do hotspare serve; done``, what
systemd's ``Restart=always`` does) on the shipped console defaults (lease 10 s, heartbeat 1 s);
one local host trains the tests' small torch job. Each trial SIGKILLs the controller and
measures, from independent evidence:

- **reattach**: the kill to the restarted controller's "reattached to executor" line in the
  journal (its first renewal is sent on reattaching);
- **margin**: the least lease left on the executor when a renewal landed, across the switch
  (each Heartbeat's ``lease_low_s``, read by a second client on the executor's socket): the
  executor stops at 0, so the margin is how far the restart was from stopping training;
- **steps/s** before the kill and after it (10 s windows, from the executor's own progress
  lines), and whether the executor process is the same one and never wrote a stop.

    python benchmarks/console_restart.py [--trials 5] [--every 20] [--settings defaults|tests]
        [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import posixpath
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "benchmarks")]

from chaos.observe import executor_events, last_step  # noqa: E402
from common import Figure, at_least, emit  # noqa: E402
from lease_under_load import observe, quantile, settings  # noqa: E402
from support.fleetbed import EXECUTOR_ENV, job_table, local_host, write_inventory  # noqa: E402

from console.fleet.link import ExecutorLink  # noqa: E402
from console.inventory import load  # noqa: E402
from console.reach.deploy import job_dir  # noqa: E402
from console.reach.transport.local import LocalTransport  # noqa: E402
from console.records.journal import Kind, read  # noqa: E402

HOTSPARE = Path(sys.executable).with_name("hotspare")
WINDOW_S = 10.0


def children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


async def wait(predicate: object, timeout: float, what: str) -> object:
    deadline = time.monotonic() + timeout
    while not (got := predicate()):  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} in {timeout:g} s")
        await asyncio.sleep(0.05)
    return got


async def sample_steps(workdir: Path, samples: list[tuple[float, int]], end: float) -> None:
    while time.time() < end:
        samples.append((time.time(), last_step(workdir)))
        await asyncio.sleep(0.5)


def rate(samples: list[tuple[float, int]], t0: float, t1: float) -> float:
    inside = [(t, s) for t, s in samples if t0 <= t <= t1]
    if len(inside) < 2 or inside[-1][0] <= inside[0][0]:
        return float("nan")
    return (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0])


async def run(folder: Path, console: dict[str, float], trials: int, every: float) -> dict:
    inv = write_inventory(
        folder / "inventory.toml",
        hosts={"a": local_host(folder / "a"), "b": local_host(folder / "b", role="spare")},
        jobs={"j": {"host": "a", "spares": ["b"], **job_table(steps=100_000_000)}},
        **console,
    )
    lease_s = load(inv).console.lease_s
    workdir = folder / "a" / "jobs" / "j"
    journal = folder / "state" / "journal.jsonl"
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "HOTSPARE_EXECUTOR_ENV": json.dumps({h: dict(EXECUTOR_ENV) for h in "ab"}),
    }
    loop = subprocess.Popen(  # noqa: ASYNC220 - started once, before anything is measured
        ["sh", "-c", 'while :; do "$0" --inventory "$1" serve; done', str(HOTSPARE), str(inv)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    lows: list[float] = []
    steps: list[tuple[float, int]] = []
    out: dict = {"lease_s": lease_s, "reattach": [], "before": [], "after": []}
    try:
        await wait(lambda: last_step(workdir) > 50, 300, "training")
        executor = int((workdir / "executor.pid").read_text())
        end = time.time() + trials * every + WINDOW_S + 5
        sock = posixpath.join(job_dir(str(folder / "a"), "j"), "executor.sock")
        probe = ExecutorLink(LocalTransport("a", root=str(folder / "a")), sock)
        watch = asyncio.create_task(
            observe(probe, lows, [], time.monotonic() + end - time.time(), 0)
        )
        sampler = asyncio.create_task(sample_steps(workdir, steps, end))
        await asyncio.sleep(WINDOW_S)
        for _ in range(trials):
            first = (await wait(lambda: children(loop.pid), 30, "controller"))[0]  # type: ignore[index]
            killed = time.time()
            os.kill(first, signal.SIGKILL)
            back = await wait(
                lambda killed=killed: next(
                    (
                        e.t
                        for e in read(journal, kinds=(Kind.EXECUTOR,))
                        if "reattached" in e.msg and e.t > killed
                    ),
                    None,
                ),
                3 * lease_s,
                "reattach",
            )
            out["reattach"].append(float(back) - killed)  # type: ignore[arg-type]
            await asyncio.sleep(max(0.0, killed + every - time.time()))
            out["before"].append(rate(steps, killed - WINDOW_S, killed))
            out["after"].append(rate(steps, killed, killed + WINDOW_S))
        await asyncio.gather(watch, sampler)
        out["same_executor"] = Path(f"/proc/{executor}").exists()
        out["stopped"] = sum(1 for e in executor_events(workdir) if e.get("kind") == "stopped")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(loop.pid, signal.SIGKILL)
        loop.wait()
        subprocess.run(  # noqa: ASYNC221 - the run is over
            [HOTSPARE, "--inventory", str(inv), "stop"], capture_output=True, timeout=120
        )
        with contextlib.suppress(OSError, ValueError):
            os.kill(int((workdir / "executor.pid").read_text()), signal.SIGKILL)
    out["margin_min"] = min(lows, default=float("nan"))
    out["margin_p1"] = quantile(lows, 0.01)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--every", type=float, default=20.0, help="seconds between kills")
    ap.add_argument("--settings", default="defaults", choices=("defaults", "tests"))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="crs-", dir="/tmp") as d:
        r = asyncio.run(run(Path(d), settings(args.settings), args.trials, args.every))
    re = r["reattach"]
    p50, p95 = quantile(re, 0.5), quantile(re, 0.95)
    before = sum(r["before"]) / len(r["before"])
    after = sum(r["after"]) / len(r["after"])
    print(
        f"{args.settings} ({r['lease_s']:g} s lease), {len(re)} controller SIGKILLs: reattached "
        f"p50 {p50:.2f} s, p95 {p95:.2f} s, max {max(re):.2f} s; lease margin at a landing min "
        f"{r['margin_min']:.2f} s; steps/s {before:.1f} in the {WINDOW_S:g} s before each kill, "
        f"{after:.1f} after ({after / before:.2f}x); same executor process: "
        f"{r['same_executor']}; stops written: {r['stopped']}",
        file=sys.stderr,
    )
    emit(
        "console_restart",
        [
            Figure("reattach p50", p50, "s"),
            Figure("reattach p95", p95, "s", f"< lease {r['lease_s']:g} s", p95 < r["lease_s"]),
            Figure("lease margin min", r["margin_min"], "s", "> 0", r["margin_min"] > 0),
            Figure(
                "steps/s after / before",
                after / before,
                "x",
                ">= 0.9",
                at_least(after / before, 0.9),
            ),
            Figure("executor stops", float(r["stopped"]), "", "0", r["stopped"] == 0),
        ],
        notes=f"{args.settings} settings, {len(re)} SIGKILLs of hotspare serve under a restart loop",
        as_json=args.json,
    )


if __name__ == "__main__":
    main()
