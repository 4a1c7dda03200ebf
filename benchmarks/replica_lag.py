"""Replica lag over SSH: a job checkpointing ~1.5 MB every second on one sshd host, each
checkpoint replicated to a spare sshd host; then one big checkpoint copied the same way.

Two loopback sshd hosts (tests/sshbed.py), a real training job on host ``a`` with spare ``b``
(the auto policy, the console in this process). Replica lag is the time from the
``CheckpointSaved`` reaching the console to the copy verified on the spare (the journal's
``replica`` events, ``lag_s``; for a build without it, the ``checkpoint`` event's time to the
``replica`` event's). The fixed cost of a copy is what it takes beyond its bytes: a small
copy's seconds less its bytes at the rate the big copy reached. Target: fixed cost <= 0.3 s.

    python benchmarks/replica_lag.py [--seconds 60] [--mb 200] [--quick] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
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

from common import Figure, at_most, to_json  # noqa: E402
from support import sshbed  # noqa: E402
from support.fleetbed import EXECUTOR_ENV, until, write_inventory  # noqa: E402

from console.controller import Controller  # noqa: E402
from console.inventory import load  # noqa: E402
from console.reach.deploy import checkpoint_file  # noqa: E402
from console.records.journal import Event, Kind, read  # noqa: E402
from console.replication.replicator import Source  # noqa: E402
from console.supervise.policy import Policy  # noqa: E402
from protocol.spec import CheckpointManifest  # noqa: E402

MB = 1 << 20
FIXED_TARGET_S = 0.3
CONFIG = {
    "n_layer": 2,
    "n_head": 4,
    "n_embd": 64,
    "block_size": 32,
    "global_batch": 8,
    "dropout": 0.0,
    "corpus_chars": 20_000,
}
"""~110k parameters: with Adam's two moments a checkpoint of about 1.4 MB."""


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def _copies(events: list[Event], start: float, stop: float) -> tuple[list[dict[str, Any]], int]:
    """Each checkpoint saved while the job ran that was verified on the spare: its seconds,
    bytes and lag (lag_s, else journal times); and how many were saved. A checkpoint that a
    newer one replaced while it waited is never copied, by design."""
    saved = {
        e.data["step"]: e.t for e in events if e.kind is Kind.CHECKPOINT and start <= e.t < stop
    }
    out = []
    for e in events:
        if e.kind is not Kind.REPLICA or not e.data.get("ok") or e.data["step"] not in saved:
            continue
        lag = e.data.get("lag_s")
        if lag is None:
            lag = e.t - saved[e.data["step"]]
        out.append({"seconds": e.data["seconds"], "bytes": e.data["bytes"], "lag": lag})
    return out, len(saved)


def _random_checkpoint(path: Path, size: int, step: int) -> CheckpointManifest:
    digest = hashlib.sha256()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        for _ in range(size // MB):
            block = os.urandom(MB)
            digest.update(block)
            f.write(block)
    return CheckpointManifest(
        job="j", step=step, file=path.name, size=size, sha256=digest.hexdigest(), epoch=1,
        spec_hash="bench", code_version="bench", created_at=time.time(),
    )  # fmt: skip


async def run(folder: Path, seconds: float, big_mb: int) -> dict[str, Any]:
    with sshbed.ssh_bed(folder / "bed") as bed:
        a, b = bed.host(name="a"), bed.host(name="b")
        inv_path = write_inventory(
            folder / "inventory.toml",
            hosts={"a": a.inventory_table("r1"), "b": b.inventory_table("r1", role="spare")},
            jobs={
                "j": {
                    "host": "a",
                    "spares": ["b"],
                    "steps": 10**9,
                    "seed": 1,
                    "checkpoint_every_s": 1.0,
                    "keep_checkpoints": 3,
                    "config": CONFIG,
                }
            },
            lease_s=10.0,
            heartbeat_s=0.5,
            suspect_after_s=3.0,
        )
        inv = load(inv_path)
        ctl = Controller(inv, Policy.AUTO, executor_env={"a": dict(EXECUTOR_ENV)})
        task = asyncio.create_task(ctl.run())
        journal = inv.state_dir / "journal.jsonl"
        await until(lambda: ctl.replicator.replica("j", "b").manifest, 300, "a first replica")
        start = time.time()
        await asyncio.sleep(seconds)
        stop = time.time()  # the checkpoint a stop takes is the stop's, not the cadence's
        ctl.stop_job("j")
        await asyncio.wait_for(task, 120)
        copies, saved = _copies(list(read(journal)), start, stop)
        # the big checkpoint, on a quiet machine: the rate the bytes go at
        step = 10**9
        path = Path(checkpoint_file(str(a.root), "j", step))
        m = _random_checkpoint(path, big_mb * MB, step)
        t0 = time.perf_counter()
        ok = await ctl.replicator.copy("j", "b", Source("a", str(path), m))
        big_s = time.perf_counter() - t0
        await ctl.close()
        if not ok:
            raise SystemExit("the big copy failed; see the journal in " + str(journal))
        return {"copies": copies, "saved": saved, "big_s": big_s, "big_bytes": m.size}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0, help="how long the job runs")
    ap.add_argument("--mb", type=int, default=200, help="the big checkpoint, MiB")
    ap.add_argument("--quick", action="store_true", help="15 s of training, a 32 MiB big copy")
    ap.add_argument("--json", action="store_true", help="also print one JSON line last")
    args = ap.parse_args()
    seconds, big_mb = (15.0, 32) if args.quick else (args.seconds, args.mb)
    with tempfile.TemporaryDirectory(prefix="rl-", dir="/tmp") as d:
        r = asyncio.run(run(Path(d), seconds, big_mb))
    copies = r["copies"]
    if not copies:
        raise SystemExit("no replica was verified while the job ran")
    rate = r["big_bytes"] / r["big_s"]
    lags = [c["lag"] for c in copies if c["lag"] is not None]
    fixed = [c["seconds"] - c["bytes"] / rate for c in copies]
    size = statistics.median(c["bytes"] for c in copies)
    fixed_p50 = statistics.median(fixed)
    print(
        f"# replica lag ({platform.machine()}, {os.cpu_count()} CPUs; two loopback sshd hosts; "
        f"checkpoint {size / 1e6:.2f} MB every 1 s for {seconds:g} s: {r['saved']} saved, "
        f"{len(copies)} replicated)"
    )
    print("| figure | p50 | p95 | max |\n|---|---|---|---|")
    for name, xs in (("replica lag", lags), ("copy seconds", [c["seconds"] for c in copies]),
                     ("fixed cost per copy", fixed)):  # fmt: skip
        print(
            f"| {name} | {statistics.median(xs):.3f} s | {_pct(xs, 0.95):.3f} s | {max(xs):.3f} s |"
        )
    print(
        f"\n{big_mb} MiB checkpoint: {r['big_s']:.2f} s, {rate / 1e6:.0f} MB/s "
        f"(fixed cost target <= {FIXED_TARGET_S:g} s: {fixed_p50:.3f} s)"
    )
    if args.json:
        figures = [
            Figure("replica lag p50", statistics.median(lags), "s"),
            Figure("replica lag p95", _pct(lags, 0.95), "s"),
            Figure(
                "fixed cost per copy (median)",
                fixed_p50,
                "s",
                f"<= {FIXED_TARGET_S:g} s",
                at_most(fixed_p50, FIXED_TARGET_S),
            ),
            Figure("fixed cost per copy p95", _pct(fixed, 0.95), "s"),
            Figure(f"transfer rate, {big_mb} MiB checkpoint", rate / 1e6, "MB/s"),
            Figure("checkpoints replicated", len(copies), f"of {r['saved']}"),
        ]
        notes = (
            f"two loopback sshd hosts, a job checkpointing {size / 1e6:.2f} MB every 1 s for "
            f"{seconds:g} s, {os.cpu_count()} CPUs; big copy {big_mb} MiB"
        )
        print(to_json("replica_lag", figures, notes), flush=True)


if __name__ == "__main__":
    main()
