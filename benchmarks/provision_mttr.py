"""MTTR when the spare must be provisioned, against a spare already there, in the same run.

Two loopback sshd hosts: a job on ``a`` (checkpoint 60 MB every 10 steps), ``b`` its cold
spare, the auto policy, lease 2 s, heartbeat 0.25 s. The fault: ``a``'s GPU fails (the fake
NVML reports a double-bit ECC error and Xid 79), so the job must move, and its checkpoint on
``a`` is still readable.

- ``spare``: ``b`` is alive; the job moves there.
- ``provisioned``: ``b`` dies at the same moment, so no host is left. The inventory's
  ``[provisioner]`` is the shipped ``examples/provision_sshd.py`` (a fresh sshd on this
  machine); the console runs it, preflights and deploys to the new host, copies the
  checkpoint there from ``a``, and starts the job on it.

Each trial's breakdown, from the GPU fault: detect (fault -> incident), wait (the first
decision -> the last: the dead spare, chosen first while nothing said it was gone, found
down; then a host provisioned), within it provision (the command's run until it printed
the host), preflight and deploy, then transfer (the checkpoint to the target, after the
last decision), start (executor up, checkpoint loaded, first step), and MTTR (fault -> first
step on the new host). Prints p50s and the extra MTTR.

    python benchmarks/provision_mttr.py [--trials 3] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "benchmarks")]

from checkpoint_cost import CONFIG  # noqa: E402  (the same 60 MB model as mttr.py)
from common import Figure, to_json  # noqa: E402
from support import sshbed  # noqa: E402
from support.fleetbed import EXECUTOR_ENV, add_provisioner, until, write_inventory  # noqa: E402

from console.controller import Controller  # noqa: E402
from console.inventory import load  # noqa: E402
from console.records.incidents import incidents  # noqa: E402
from console.records.journal import Kind, read  # noqa: E402
from console.supervise.policy import Policy  # noqa: E402
from executors.testing.gpu_fake import write_state  # noqa: E402

EVERY = 10
CONSOLE = {"lease_s": 2.0, "heartbeat_s": 0.25, "suspect_after_s": 0.75, "clock_skew_s": 0.1}
HEALTHY = {"devices": [{"name": "Fake H100", "temp_c": 50}]}
FAILED = {"devices": [{"name": "Fake H100", "temp_c": 50, "ecc_uncorrected": 2, "xids": [79]}]}
COLS = ["detect", "wait", "provision", "preflight", "deploy", "transfer", "start", "mttr"]


async def trial(folder: Path, provisioned: bool) -> dict[str, float]:
    with sshbed.ssh_bed(folder / "bed") as bed:
        a, b = bed.host(name="a"), bed.host(name="b")
        nvml = folder / "nvml-a.json"
        write_state(nvml, HEALTHY)
        inv = write_inventory(
            folder / "inventory.toml",
            hosts={"a": a.inventory_table("r1"), "b": b.inventory_table("r1", role="spare")},
            jobs={
                "j": {
                    "host": "a",
                    "spares": ["b"],
                    "steps": 1_000_000,
                    "seed": 1,
                    "checkpoint_every_steps": EVERY,
                    "keep_checkpoints": 2,
                    "config": CONFIG,
                }
            },
            **CONSOLE,
        )
        made = bed.folder / "made"
        command, release = bed.sshd_provisioner(made)
        if provisioned:
            add_provisioner(inv, command, release, max_hosts=1, retry_s=1.0)
        env = {h: dict(EXECUTOR_ENV) for h in ("a", "b", "prov-1")}
        env["a"]["HOTSPARE_FAKE_NVML"] = str(nvml)
        ctl = Controller(load(inv), Policy.AUTO, executor_env=env)
        sup = ctl.jobs["j"]
        journal = inv.parent / "state" / "journal.jsonl"
        task = asyncio.create_task(ctl.run(stay=True))
        try:
            await until(
                lambda: sup.step >= 2 * EVERY + 3 and ctl.replicator.replica("j", "b").manifest,
                300,
                "training and a replica on b",
            )
            fault_at = time.time()
            write_state(nvml, FAILED)
            if provisioned:
                b.kill_all()
            await until(
                lambda: any(i.resolved for i in incidents(read(journal))), 180, "first step"
            )
        finally:
            ctl.stop_job("j")
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await ctl.close()
            if provisioned:
                for left in made.glob("prov-*"):
                    proc = await asyncio.create_subprocess_exec(*release, left.name)
                    await asyncio.wait_for(proc.wait(), 60)
        events = list(read(journal))
        inc = next(i for i in incidents(events) if i.resolved)
        inc.fault_at = fault_at
        parts = inc.breakdown()
        decided = [
            e.t
            for e in events
            if e.kind is Kind.INCIDENT and e.incident == inc.id and e.data.get("phase") == "decided"
        ]
        out: dict[str, Any] = {
            "detect": parts.get("detect", 0.0),
            "wait": decided[-1] - decided[0],
            "transfer": inc.times["transfer_done"] - decided[-1],
            "start": sum(parts.get(k, 0.0) for k in ("start", "load", "first step")),
            "mttr": inc.times["first_step"] - fault_at,
            "host": sup.host,
        }
        done = [
            e.data for e in events if e.kind is Kind.ACTION and e.data.get("provision") == "done"
        ]
        for key, col in (
            ("made_s", "provision"),
            ("preflight_s", "preflight"),
            ("deploy_s", "deploy"),
        ):
            out[col] = done[0][key] if done else 0.0
        return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--json", action="store_true", help="also print one JSON line last")
    args = ap.parse_args()
    rows: dict[str, list[dict[str, Any]]] = {"spare": [], "provisioned": []}
    for i in range(args.trials):
        for mode in rows:
            with tempfile.TemporaryDirectory(prefix="pm-", dir="/tmp") as d:
                r = asyncio.run(trial(Path(d), mode == "provisioned"))
            rows[mode].append(r)
            print(f"trial {i + 1} {mode}: MTTR {r['mttr']:.2f} s on {r['host']}", file=sys.stderr)
    settings = ", ".join(f"{k} {v:g} s" for k, v in CONSOLE.items())
    print(
        f"# MTTR, spare there vs provisioned ({platform.machine()}, {os.cpu_count()} CPUs; "
        f"loopback sshd hosts; 60 MB checkpoint every {EVERY} steps; GPU fail on the job's "
        f"host; {settings})"
    )
    print("| mode | trial | " + " | ".join(COLS) + " | moved to |")
    print("|---" * (len(COLS) + 3) + "|")
    for mode, trials in rows.items():
        for i, r in enumerate(trials, 1):
            cells = " | ".join(f"{r[c]:.2f}" for c in COLS)
            print(f"| {mode} | {i} | {cells} | {r['host']} |")
    p50 = {m: statistics.median(r["mttr"] for r in rows[m]) for m in rows}
    extra = p50["provisioned"] - p50["spare"]
    print(
        f"\nMTTR p50: spare there {p50['spare']:.2f} s, provisioned {p50['provisioned']:.2f} s; "
        f"extra {extra:.2f} s ({p50['provisioned'] / p50['spare']:.2f}x)"
    )
    if args.json:
        med = lambda col: statistics.median(r[col] for r in rows["provisioned"])  # noqa: E731
        figures = [
            Figure("MTTR p50, spare there", p50["spare"], "s"),
            Figure("MTTR p50, provisioned", p50["provisioned"], "s"),
            Figure("extra MTTR when provisioned (p50)", extra, "s"),
            *(Figure(f"{c} (median, provisioned)", med(c), "s") for c in COLS[1:7]),
        ]
        notes = (
            f"{args.trials} trials each, loopback sshd, 60 MB checkpoint, GPU fail; provisioner "
            "examples/provision_sshd.py (a fresh sshd on this machine)"
        )
        print(to_json("provision_mttr", figures, notes), flush=True)


if __name__ == "__main__":
    main()
