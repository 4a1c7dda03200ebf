"""The leading controller SIGKILLed, a standby on etcd takes over: does training notice?

A real 3-member etcd cluster on loopback; two ``hotspare serve`` controllers of one inventory
(each its own state dir, each under its own restart loop, so a killed leader comes back as
the standby); one local host trains the tests' small torch job on the shipped console
defaults (lease 10 s, heartbeat 1 s; the leader's etcd lease a third of it). Each trial
SIGKILLs whichever controller leads (its pid from etcd's leader key) and measures:

- **takeover**: the kill to the new leader's "reattached to executor" line in its journal
  (its first renewal is sent on reattaching);
- **margin**: the least lease left on the executor when a renewal landed, across the switch
  (each Heartbeat's ``lease_low_s``, read by a second client on the executor's socket);
- **steps/s** in the 10 s before each kill and after it, the executor process the same one
  and never a stop written.

    python benchmarks/console_failover.py [--trials 5] [--every 25] [--settings defaults|tests]
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
from console_restart import WINDOW_S, rate, sample_steps, wait  # noqa: E402
from lease_under_load import observe, quantile, settings  # noqa: E402
from support.etcdbed import EtcdCluster  # noqa: E402
from support.fleetbed import EXECUTOR_ENV, job_table, local_host, write_inventory  # noqa: E402

from console.fleet.link import ExecutorLink  # noqa: E402
from console.inventory import load  # noqa: E402
from console.reach.deploy import job_dir  # noqa: E402
from console.reach.transport.local import LocalTransport  # noqa: E402
from console.records.journal import Kind, read  # noqa: E402
from console.service.etcd import Etcd  # noqa: E402

HOTSPARE = Path(sys.executable).with_name("hotspare")
PREFIX = "/hotspare-bench"


def leader_pid(etcd: Etcd) -> int | None:
    kv = etcd.get(f"{PREFIX}/leader")
    if kv is None:
        return None
    return int(kv.value.decode().split(":")[1])  # host:pid:state_dir


async def run(folder: Path, console: dict[str, float], trials: int, every: float) -> dict:
    (folder / "etcd").mkdir()
    cluster = EtcdCluster(folder / "etcd")
    await asyncio.to_thread(cluster.start)
    etcd = Etcd(cluster.endpoints)
    invs = []
    for name in ("c1", "c2"):
        (folder / name).mkdir()
        invs.append(
            write_inventory(
                folder / name / "inventory.toml",
                hosts={"a": local_host(folder / "a"), "b": local_host(folder / "b", role="spare")},
                jobs={"j": {"host": "a", "spares": ["b"], **job_table(steps=100_000_000)}},
                **{**console, "etcd": cluster.endpoints, "etcd_prefix": PREFIX},
            )
        )
    lease_s = load(invs[0]).console.lease_s
    journals = [inv.parent / "state" / "journal.jsonl" for inv in invs]
    workdir = folder / "a" / "jobs" / "j"
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "HOTSPARE_EXECUTOR_ENV": json.dumps({h: dict(EXECUTOR_ENV) for h in "ab"}),
    }
    loops = [
        subprocess.Popen(  # noqa: ASYNC220 - started once, before anything is measured
            ["sh", "-c", 'while :; do "$0" --inventory "$1" serve; done', str(HOTSPARE), str(inv)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        for inv in invs
    ]
    lows: list[float] = []
    steps: list[tuple[float, int]] = []
    out: dict = {"lease_s": lease_s, "takeover": [], "before": [], "after": []}
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
            pid = await wait(lambda: leader_pid(etcd), 30, "a leader")
            killed = time.time()
            os.kill(pid, signal.SIGKILL)  # type: ignore[arg-type]
            back = await wait(
                lambda killed=killed: next(
                    (
                        e.t
                        for j in journals
                        for e in read(j, kinds=(Kind.EXECUTOR,))
                        if "reattached" in e.msg and e.t > killed
                    ),
                    None,
                ),
                3 * lease_s,
                "takeover",
            )
            out["takeover"].append(float(back) - killed)  # type: ignore[arg-type]
            await asyncio.sleep(max(0.0, killed + every - time.time()))
            out["before"].append(rate(steps, killed - WINDOW_S, killed))
            out["after"].append(rate(steps, killed, killed + WINDOW_S))
        await asyncio.gather(watch, sampler)
        out["same_executor"] = Path(f"/proc/{executor}").exists()
        out["stopped"] = sum(1 for e in executor_events(workdir) if e.get("kind") == "stopped")
    finally:
        for loop in loops:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(loop.pid, signal.SIGKILL)
            loop.wait()
        with contextlib.suppress(OSError, ValueError):
            os.kill(int((workdir / "executor.pid").read_text()), signal.SIGKILL)
        cluster.stop()
    out["margin_min"] = min(lows, default=float("nan"))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--every", type=float, default=25.0, help="seconds between kills")
    ap.add_argument("--settings", default="defaults", choices=("defaults", "tests"))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="cfo-", dir="/tmp") as d:
        r = asyncio.run(run(Path(d), settings(args.settings), args.trials, args.every))
    t = r["takeover"]
    p50, p95 = quantile(t, 0.5), quantile(t, 0.95)
    before = sum(r["before"]) / len(r["before"])
    after = sum(r["after"]) / len(r["after"])
    print(
        f"{args.settings} ({r['lease_s']:g} s lease), {len(t)} leader SIGKILLs: the standby "
        f"reattached p50 {p50:.2f} s, p95 {p95:.2f} s, max {max(t):.2f} s; lease margin at a "
        f"landing min {r['margin_min']:.2f} s; steps/s {before:.1f} in the {WINDOW_S:g} s before "
        f"each kill, {after:.1f} after ({after / before:.2f}x); same executor process: "
        f"{r['same_executor']}; stops written: {r['stopped']}",
        file=sys.stderr,
    )
    emit(
        "console_failover",
        [
            Figure("takeover p50", p50, "s"),
            Figure("takeover p95", p95, "s", f"< lease {r['lease_s']:g} s", p95 < r["lease_s"]),
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
        notes=f"{args.settings} settings, {len(t)} SIGKILLs of the leading controller, 3-member etcd",
        as_json=args.json,
    )


if __name__ == "__main__":
    main()
