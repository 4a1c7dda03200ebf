"""Replica copies host to host and through the console, against OpenSSH scp, one cipher.

Two loopback sshd hosts (tests/sshbed.py): ``a`` holds a checkpoint of ``--mb`` MiB (with
``--files N``: a folder of N files of that size in all, as DCP writes a part; the scp legs
then copy the folder with ``-r``), ``b`` is the spare. Per round, interleaved, each from a clean destination:

- hotspare direct: ``Replicator.copy`` with b's authorized_keys named, so a sends to b with
  the job's scoped key (``console/replication/direct.py``); the console reads none of the bytes.
- ``scp`` run on a (over ssh to a) straight to b: the baseline for direct.
- hotspare relay: ``Replicator.copy`` with b's authorized_keys not named: the bytes cross
  the console (``console/replication/replica.py``).
- ``scp -3`` from the console: the baseline for the relay.

Every leg uses ``aes128-gcm@openssh.com`` (hotspare offers it first, scp is told ``-c``).
hotspare's copies also do what scp does not: the spare's room check, the sha256 of every
byte, fsync, the renames and the manifest. Its consoles are warm (one untimed copy each
first: the key installed, connections open), as a running console's are; each scp starts
its connections. Prints a markdown table of MB/s (median) and the ratios.

    python benchmarks/host_to_host.py [--mb 256] [--rounds 5] [--files N] [--json]

The rounds are interleaved and the medians taken; the notes give the load average, since
on a shared machine other work moves these figures more than anything here does.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "benchmarks")]

from common import Figure, at_least, to_json  # noqa: E402
from support import sshbed  # noqa: E402
from support.fleetbed import job_table, write_inventory  # noqa: E402

from console.controller import Controller  # noqa: E402
from console.inventory import load  # noqa: E402
from console.reach.deploy import replica_dir  # noqa: E402
from console.records.journal import Kind, read  # noqa: E402
from console.replication.replicator import Source  # noqa: E402
from console.supervise.policy import Policy  # noqa: E402
from protocol.spec import CheckpointManifest, FolderFile  # noqa: E402

MB = 1 << 20
CIPHER = "aes128-gcm@openssh.com"
SCP_TIMEOUT = 600
DIRECT, SCP, RELAY, SCP3 = (
    "hotspare direct (a -> b, job key)",
    "scp run on a (a -> b)",
    "hotspare relay (a -> console -> b)",
    "scp -3 (a -> console -> b)",
)
TARGET = 0.9
"""hotspare at least 0.9x its scp counterpart, though it hashes and fsyncs every byte."""


class Bench:
    def __init__(self, folder: Path, bed: sshbed.SshBed, size: int, files: int) -> None:
        self.bed, self.size = bed, size
        self.a, self.b = bed.host(name="a"), bed.host(name="b")
        self.src = self.a.root / "jobs" / "j" / "checkpoints" / "step.pt"
        self.src.parent.mkdir(parents=True)
        self.files: list[FolderFile] | None = None
        if files:
            self.src.mkdir()
            self.files = [
                FolderFile(path=name, size=n, sha256=_random_file(self.src / name, n))
                for name, n in _parts(size, files)
            ]
            self.sha256 = _tree(self.files)
        else:
            self.sha256 = _random_file(self.src, size)
        self.dst = self.b.root / "scp.bin"
        self.step = 0
        self.consoles: dict[str, Controller] = {}
        for route, spare in (
            ("direct", {"authorized_keys": str(bed.authorized_keys)}),
            ("relay", {}),
        ):
            (folder / route).mkdir()
            inv = write_inventory(
                folder / route / "inventory.toml",
                hosts={"a": self.a.inventory_table(), "b": self.b.inventory_table(**spare)},
                jobs={f"j{route}": {"host": "a", "spares": ["b"], **job_table()}},
                min_free_disk_gb=0.0,
                replicas_kept=1,
            )
            self.consoles[route] = Controller(load(inv), Policy.AUTO)

    async def hotspare(self, route: str) -> None:
        self.step += 1
        job = f"j{route}"
        m = CheckpointManifest(
            job=job, step=self.step, file=self.src.name, size=self.size, sha256=self.sha256,
            epoch=1, spec_hash="bench", code_version="bench", created_at=time.time(),
            files=self.files,
        )  # fmt: skip
        ctl = self.consoles[route]
        if not await ctl.replicator.copy(job, "b", Source("a", str(self.src), m)):
            raise SystemExit(f"the {route} copy failed; see {ctl.journal.path}")
        (last,) = [e for e in read(ctl.journal.path) if e.kind is Kind.REPLICA][-1:]
        if last.data.get("route") != route:
            raise SystemExit(f"a {route} copy went {last.data.get('route')}: {ctl.journal.path}")

    def scp_on_a(self) -> None:
        inner = ["scp", "-q", "-r", "-c", CIPHER, *self.bed.ssh_options(), "-P", str(self.b.port)]
        inner += [str(self.src), f"root@{self.b.address}:{self.dst}"]
        outer = ["ssh", *self.bed.ssh_options(), "-c", CIPHER, "-p", str(self.a.port)]
        outer += [f"root@{self.a.address}", shlex.join(inner)]
        subprocess.run(outer, check=True, timeout=SCP_TIMEOUT)

    def scp3(self) -> None:
        subprocess.run(
            ["scp", "-q", "-r", "-3", "-c", CIPHER, *self.bed.ssh_options(),
             _uri(self.a, self.src), _uri(self.b, self.dst)],
            check=True, timeout=SCP_TIMEOUT,
        )  # fmt: skip

    def clean(self) -> None:
        if self.dst.is_dir():
            shutil.rmtree(self.dst)
        self.dst.unlink(missing_ok=True)

    def check_scp(self) -> None:
        if self.files is None:
            got = _sha256(self.dst)
        else:
            got = _tree([FolderFile(path=f.path, size=f.size, sha256=_sha256(self.dst / f.path))
                         for f in self.files])  # fmt: skip
        if got != self.sha256:
            raise SystemExit(f"a corrupt scp copy at {self.dst}")

    async def close(self) -> None:
        for ctl in self.consoles.values():
            await ctl.close()


def _uri(host: sshbed.SshHost, path: Path) -> str:
    return f"scp://root@{host.address}:{host.port}/{path}"


def _random_file(path: Path, size: int) -> str:
    digest = hashlib.sha256()
    with open(path, "wb") as f:
        for _ in range(size // MB):
            block = os.urandom(MB)
            digest.update(block)
            f.write(block)
    return digest.hexdigest()


def _parts(size: int, files: int) -> list[tuple[str, int]]:
    """A DCP part's names: the index, then data files sharing the rest (whole MiB each)."""
    index = MB
    each = (size - index) // (files - 1) // MB * MB if files > 1 else 0
    data = [(f"__{i}_0.distcp", each) for i in range(files - 1)]
    return [(".metadata", size - each * (files - 1)), *data]


def _tree(files: list[FolderFile]) -> str:
    """The folder's sha256 as its manifest gives it: over ``SHA256 SIZE PATH`` lines, path order."""
    lines = "".join(f"{f.sha256} {f.size} {f.path}\n" for f in sorted(files, key=lambda f: f.path))
    return hashlib.sha256(lines.encode()).hexdigest()


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(4 * MB):
            digest.update(block)
    return digest.hexdigest()


async def measure(folder: Path, size: int, rounds: int, files: int) -> dict[str, list[float]]:
    with sshbed.ssh_bed(folder / "bed") as bed:
        bench = Bench(folder, bed, size, files)
        try:
            for route in ("direct", "relay"):  # warm: key installed, connections open
                await bench.hotspare(route)
            ways: dict[str, Callable[[], Awaitable[None] | None]] = {
                DIRECT: lambda: bench.hotspare("direct"),
                SCP: bench.scp_on_a,
                RELAY: lambda: bench.hotspare("relay"),
                SCP3: bench.scp3,
            }
            rates: dict[str, list[float]] = {name: [] for name in ways}
            for _ in range(rounds):  # interleaved, so load drift hits every way alike
                for name, way in ways.items():
                    bench.clean()
                    t0 = time.perf_counter()
                    pending = way()
                    if pending is not None:
                        await pending
                    rates[name].append(size / 1e6 / (time.perf_counter() - t0))
                    if name in (SCP, SCP3):
                        bench.check_scp()
            for route in ("direct", "relay"):  # replicas_kept = 1: the newest alone
                folder = replica_dir(str(bench.b.root), f"j{route}")
                if len(os.listdir(folder)) != 2:
                    raise SystemExit(f"odd replica folder {folder}: {os.listdir(folder)}")
            return rates
        finally:
            await bench.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=256, help="checkpoint size, MiB")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument(
        "--files", type=int, default=0, help="a folder of this many files (0: one file)"
    )
    ap.add_argument("--json", action="store_true", help="also print one JSON line last")
    args = ap.parse_args()
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="h2h-", dir="/tmp") as d:
        rates = asyncio.run(measure(Path(d), args.mb * MB, args.rounds, args.files))
    load = f"load average {load:.1f} at start, {os.getloadavg()[0]:.1f} at end"
    med = {name: statistics.median(r) for name, r in rates.items()}
    direct, relay = med[DIRECT] / med[SCP], med[RELAY] / med[SCP3]
    ssh_v = subprocess.run(["ssh", "-V"], capture_output=True, text=True).stderr.strip()
    setup = (
        f"{args.mb} MiB"
        + (f" in a folder of {args.files} files" if args.files else "")
        + f", {args.rounds} rounds, two loopback sshd hosts, {os.cpu_count()} CPUs, "
        f"cipher {CIPHER}, {ssh_v}, Python {platform.python_version()}; {load}"
    )
    print(f"\n{setup}\n")
    print("| method | MB/s (median) | rounds | vs its scp |")
    print("| --- | ---: | --- | ---: |")
    base = {DIRECT: SCP, SCP: SCP, RELAY: SCP3, SCP3: SCP3}
    for name, r in rates.items():
        each = ", ".join(f"{x:.0f}" for x in r)
        print(f"| {name} | {med[name]:.0f} | {each} | {med[name] / med[base[name]]:.2f}x |")
    print(f"\nhotspare direct / hotspare relay: {med[DIRECT] / med[RELAY]:.2f}x")
    if args.json:
        figures = [
            Figure(DIRECT, med[DIRECT], "MB/s"),
            Figure(SCP, med[SCP], "MB/s"),
            Figure("direct / scp on a", direct, "x", f">= {TARGET}x", at_least(direct, TARGET)),
            Figure(RELAY, med[RELAY], "MB/s"),
            Figure(SCP3, med[SCP3], "MB/s"),
            Figure("relay / scp -3", relay, "x", f">= {TARGET}x", at_least(relay, TARGET)),
            Figure("direct / relay", med[DIRECT] / med[RELAY], "x"),
        ]
        print(to_json("host_to_host", figures, setup), flush=True)


if __name__ == "__main__":
    main()
