"""The fleet side of benchmarks/console_scale.py: the inventory of N hosts in four regions,
the simulated executors' process (benchmarks/simexec.py), and one ExecutorLink per host whose
messages reach ``fleet.seen`` / ``fleet.observe`` as a warm standby's do (console/supervise/standby.py
``_route``). Each link runs over its host's transport from the controller's fleet: a local
socket, or with ``--transport ssh`` a streamlocal channel over the host's SshTransport
connection (``scale_sshd.py``), the transport's own ``open_socket`` either way.

Imported by ``console_scale.py``, which puts the repository root and ``benchmarks/`` on
``sys.path`` first.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import tomli_w
from simexec import host_name, socket_path

from console.controller import Controller
from console.fleet.link import ExecutorLink, LinkError
from protocol.messages import ExecutorMessage, Health, Heartbeat

REGIONS = ("us-east", "us-west", "eu-west", "ap-south")
OPEN_TIMEOUT_S = 10.0
OPEN_CONCURRENCY = 64
SIM_READY_TIMEOUT_S = 120.0
SIMEXEC = Path(__file__).resolve().parent / "simexec.py"


@dataclass
class Traffic:
    """What the links delivered, counted after ``fleet.seen`` / ``fleet.observe`` returned."""

    health: int = 0
    heartbeats: int = 0
    lags: list[float] = field(default_factory=list)
    record_lag: bool = False


class SimLinks:
    """One ExecutorLink per host to its simulated executor, routed as a warm standby's is."""

    def __init__(self, ctl: Controller, root: Path, count: int) -> None:
        self.ctl = ctl
        self.root = root
        self.count = count
        self.traffic = Traffic()
        self.links: list[ExecutorLink] = []
        self.pumps: list[asyncio.Task[str]] = []
        self.failed: list[str] = []
        self.open_s: list[float] = []
        """Seconds each link took to open (over ssh: the dial, the channel and the Hello),
        waiting for a turn among OPEN_CONCURRENCY not counted."""
        self.all_open_s = 0.0
        """Wall seconds from the first link opening to the last one open (or failed)."""

    def _route(self, host: str, msg: ExecutorMessage) -> None:
        fleet = self.ctl.fleet
        if isinstance(msg, Heartbeat):
            fleet.seen(host)
            self.traffic.heartbeats += 1
        elif isinstance(msg, Health):
            fleet.observe(host, msg)
            self.traffic.health += 1
            if self.traffic.record_lag:
                self.traffic.lags.append(time.time() - msg.t)

    async def _open(self, i: int, gate: asyncio.Semaphore) -> None:
        host = host_name(i)
        rt = self.ctl.fleet.hosts[host]
        link = ExecutorLink(rt.transport, str(socket_path(self.root, i)), self.ctl.console_id)
        async with gate:
            t = time.perf_counter()
            try:
                await link.open(timeout=OPEN_TIMEOUT_S)
            except LinkError as e:
                self.failed.append(str(e))
                return
            self.open_s.append(time.perf_counter() - t)
        self.links.append(link)
        self.pumps.append(asyncio.create_task(link.pump(lambda m: self._route(host, m))))

    def hold_jobs(self) -> None:
        """A host whose executor reports to the console holds a job (primary or standby) in
        production, and the host monitor probes only hosts without one: so here too, from the
        start, so that the baseline differs from the loaded run by the traffic alone."""
        for i in range(self.count):
            self.ctl.fleet.hosts[host_name(i)].job = f"j{i:04d}"

    async def open_all(self) -> None:
        gate = asyncio.Semaphore(OPEN_CONCURRENCY)
        t = time.perf_counter()
        try:
            await asyncio.gather(*(self._open(i, gate) for i in range(self.count)))
        finally:
            self.all_open_s = time.perf_counter() - t

    async def close(self) -> None:
        for task in self.pumps:
            task.cancel()
        await asyncio.gather(*self.pumps, return_exceptions=True)
        for link in self.links:
            link.close()
        # Over ssh, each host's connection too (a local transport has nothing to close).
        hosts = self.ctl.fleet.hosts
        await asyncio.gather(
            *(hosts[host_name(i)].transport.close() for i in range(self.count)),
            return_exceptions=True,
        )


def write_inventory(
    tmp: Path,
    hosts_root: Path,
    count: int,
    reach: Callable[[int], dict[str, Any]] | None = None,
) -> Path:
    """N hosts in four regions; ``reach(i)`` gives host ``i``'s transport keys (default: local)."""
    hosts = {}
    for i in range(count):
        hosts[host_name(i)] = {
            "region": REGIONS[i * len(REGIONS) // max(count, 1)],
            **(reach(i) if reach is not None else {"transport": "local"}),
            "root": str(hosts_root / host_name(i)),
            "gpus": 8,
            "role": "spare" if i % 10 == 9 else "primary",
        }
    data = {
        "console": {"state_dir": str(tmp / "state"), "heartbeat_s": 1.0},
        "regions": {r: {"priority": n + 1} for n, r in enumerate(REGIONS)},
        "hosts": hosts,
    }
    path = tmp / "inventory.toml"
    path.write_text(tomli_w.dumps(data))
    return path


class Sim:
    """The simulated executors' process: started, awaited ready, always reaped."""

    def __init__(self, hosts_root: Path, count: int, log: Path, max_s: float) -> None:
        self.argv = [
            sys.executable,
            str(SIMEXEC),
            "--dir",
            str(hosts_root),
            "--count",
            str(count),
            "--parent",
            str(os.getpid()),
            "--max-s",
            str(max_s),
        ]
        self.log = log
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        with self.log.open("wb") as err:
            self.proc = await asyncio.create_subprocess_exec(
                *self.argv, stdout=asyncio.subprocess.PIPE, stderr=err
            )
        assert self.proc.stdout is not None
        async with asyncio.timeout(SIM_READY_TIMEOUT_S):
            line = await self.proc.stdout.readline()
        if line.strip() != b"ready":
            raise RuntimeError(f"simulated executors did not start: {self.log.read_text()[-2000:]}")

    async def stop(self) -> str:
        """SIGTERM, then its one-line report (SIGKILL if it does not end in time)."""
        proc = self.proc
        if proc is None or proc.returncode is not None:
            return ""
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            async with asyncio.timeout(10):
                out, _ = await proc.communicate()
        except TimeoutError:
            self.kill()
            return "the simulated executors did not stop on SIGTERM (killed)"
        return out.decode(errors="replace").strip().splitlines()[-1] if out.strip() else ""

    def kill(self) -> None:
        """Last resort, also after the event loop is gone (Ctrl-C, a failure)."""
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, ChildProcessError):
                os.kill(self.proc.pid, signal.SIGKILL)
                os.waitpid(self.proc.pid, 0)
