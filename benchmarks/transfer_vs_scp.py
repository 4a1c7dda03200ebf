"""Host-to-host checkpoint transfer: hotspare's ssh transport against OpenSSH ``scp``.

Two real sshd hosts on loopback (tests/sshbed.py), one random file on host A, copied to
host B through this machine. Every method starts from fresh connections; hotspare's figure
also includes writing ``.part``, fsync, the sha256 check on B and the rename, which scp
does not do. Prints a markdown table of MB/s (median of the rounds) and the ratio to
``scp -3``. Target: hotspare >= 1.0x.

    python benchmarks/transfer_vs_scp.py [--mb 200] [--rounds 3] [--no-variants] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "tests"), str(REPO / "benchmarks")]

import asyncssh  # noqa: E402
from common import Figure, at_least, to_json  # noqa: E402
from support import sshbed  # noqa: E402

from console.reach.transport.files import transfer  # noqa: E402
from console.reach.transport.ssh import SshTarget, SshTransport, SshTuning  # noqa: E402

MB = 1 << 20
SCP_TIMEOUT = 300
HOTSPARE = "hotspare transfer (exec stream, aes128-gcm)"


def target(host: sshbed.SshHost) -> SshTarget:
    bed = host.bed
    return SshTarget(
        name=host.name,
        addresses=[host.address],
        port=host.port,
        user="root",
        identity=str(bed.client_key),
        known_hosts=str(bed.known_hosts),
        command_timeout=60.0,
    )


def scp(bed: sshbed.SshBed, *args: str) -> None:
    subprocess.run(["scp", "-q", *bed.ssh_options(), *args], check=True, timeout=SCP_TIMEOUT)


def uri(host: sshbed.SshHost, path: Path) -> str:
    return f"scp://root@{host.address}:{host.port}/{path}"


class Bench:
    def __init__(self, bed: sshbed.SshBed, size: int) -> None:
        self.bed = bed
        self.a, self.b = bed.host(), bed.host()
        self.src = self.a.root / "checkpoint.bin"
        self.dst = self.b.root / "checkpoint.bin"
        self.local = bed.folder / "via-local.bin"
        self.size = size
        self.sha256 = _random_file(self.src, size)

    def _clean(self) -> None:
        for p in (self.dst, self.local, Path(f"{self.dst}.part")):
            p.unlink(missing_ok=True)

    def _verify(self) -> None:
        if _sha256(self.dst) != self.sha256:
            raise SystemExit(f"corrupt copy at {self.dst}")

    def scp3(self) -> None:
        scp(self.bed, "-3", uri(self.a, self.src), uri(self.b, self.dst))

    def scp_via_local(self) -> None:
        scp(self.bed, uri(self.a, self.src), str(self.local))
        scp(self.bed, str(self.local), uri(self.b, self.dst))

    async def hotspare(self, tuning: SshTuning | None = None) -> None:
        async with (
            SshTransport(target(self.a), tuning) as src,
            SshTransport(target(self.b), tuning) as dst,
        ):
            await transfer(src, str(self.src), dst, str(self.dst), sha256=self.sha256)

    async def sftp(self, ciphers: tuple[str, ...] | None = None) -> None:
        """asyncssh SFTP, streamed 1 MiB at a time, with asyncssh's defaults unless told."""
        opts: dict[str, object] = {"encryption_algs": list(ciphers)} if ciphers else {}

        def connect(h: sshbed.SshHost) -> Awaitable[asyncssh.SSHClientConnection]:
            return asyncssh.connect(
                h.address,
                port=h.port,
                username="root",
                client_keys=[str(self.bed.client_key)],
                known_hosts=str(self.bed.known_hosts),
                **opts,  # type: ignore[arg-type]
            )

        async with (
            await connect(self.a) as ca,
            await connect(self.b) as cb,
            ca.start_sftp_client() as sa,
            cb.start_sftp_client() as sb,
            sa.open(str(self.src), "rb") as f,
            sb.open(str(self.dst), "wb") as g,
        ):
            while block := await f.read(MB):
                await g.write(block)

    def once(self, run: Callable[[], None]) -> float:
        """MB/s of one copy from scratch, checked bit for bit afterwards."""
        self._clean()
        start = time.perf_counter()
        run()
        rate = self.size / 1e6 / (time.perf_counter() - start)
        self._verify()
        self._clean()
        return rate


def _random_file(path: Path, size: int) -> str:
    digest = hashlib.sha256()
    with open(path, "wb") as f:
        for _ in range(size // MB):
            block = os.urandom(MB)
            digest.update(block)
            f.write(block)
    return digest.hexdigest()


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(4 * MB):
            digest.update(block)
    return digest.hexdigest()


def methods(bench: Bench, variants: bool) -> dict[str, Callable[[], None]]:
    def aio(make: Callable[[], Awaitable[None]]) -> Callable[[], None]:
        return lambda: asyncio.run(make())

    table: dict[str, Callable[[], None]] = {
        "OpenSSH scp -3 (A -> console -> B)": bench.scp3,
        "OpenSSH scp A -> local file -> B": bench.scp_via_local,
        HOTSPARE: aio(bench.hotspare),
    }
    if variants:
        chacha = SshTuning(ciphers=("chacha20-poly1305@openssh.com",))
        gcm = ("aes128-gcm@openssh.com",)
        table.update(
            {
                "asyncssh SFTP, default settings (chacha20-poly1305)": aio(bench.sftp),
                "asyncssh SFTP, aes128-gcm": aio(lambda: bench.sftp(gcm)),
                "hotspare exec stream, chacha20-poly1305": aio(lambda: bench.hotspare(chacha)),
            }
        )
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=200, help="file size in MiB")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-variants", action="store_true", help="skip the tuning variants")
    parser.add_argument("--json", action="store_true", help="also print one JSON line last")
    args = parser.parse_args()
    with sshbed.ssh_bed() as bed:
        bench = Bench(bed, args.mb * MB)
        table = methods(bench, not args.no_variants)
        rates: dict[str, list[float]] = {name: [] for name in table}
        for _ in range(args.rounds):  # interleaved, so load drift hits every method alike
            for name, run in table.items():
                rates[name].append(bench.once(run))
    base = statistics.median(rates["OpenSSH scp -3 (A -> console -> B)"])
    cpus = os.cpu_count()
    print(
        f"\n{args.mb} MiB, {args.rounds} rounds, loopback, {cpus} CPUs, {platform.python_version()}"
    )
    print(
        f"{subprocess.run(['ssh', '-V'], capture_output=True, text=True).stderr.strip()}, asyncssh {asyncssh.__version__}\n"
    )
    print("| method | MB/s (median) | rounds | vs scp -3 |")
    print("| --- | ---: | --- | ---: |")
    for name, r in rates.items():
        median = statistics.median(r)
        each = ", ".join(f"{x:.0f}" for x in r)
        print(f"| {name} | {median:.0f} | {each} | {median / base:.2f}x |")
    if args.json:
        ours = statistics.median(rates[HOTSPARE])
        figures = [Figure(name, statistics.median(r), "MB/s") for name, r in rates.items()]
        figures.append(
            Figure(
                "hotspare transfer / scp -3",
                ours / base,
                "x",
                ">= 1.0x",
                at_least(ours / base, 1.0),
            )
        )
        notes = f"{args.mb} MiB, {args.rounds} rounds, two loopback sshd hosts, {cpus} CPUs"
        print(to_json("transfer_vs_scp", figures, notes), flush=True)


if __name__ == "__main__":
    main()
