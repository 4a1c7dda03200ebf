"""The sshd side of ``benchmarks/console_scale.py --transport ssh``: real OpenSSH sshd on
loopback, through which the console reaches every simulated executor.

A few ``sshd -D`` listeners (``--sshds``, one per region by default), each on its own loopback
address and port with its own ed25519 host key; the inventory's hosts are dealt among them. One
client key is authorized on all, and one ``known_hosts`` lists every listener's key, so the
console's production ``SshTransport`` verifies host keys exactly as it would in a fleet (never
disabled). Each host is one SSH connection (sshd forks a session per connection) whose
executor link is a ``direct-streamlocal`` channel to the simulated executor's Unix socket on
this machine, as ``SshTransport.open_socket`` opens it in production.

sshd's limits are raised to hold every connection: ``MaxStartups`` above the hosts (connections
still authenticating at once), ``MaxSessions`` per connection, and the open-file limit
(``raise_fd_limit``), which sshd inherits.

Every process started here is recorded by pid (the listener, and its session children as
psutil finds them) and killed by pid on ``stop``, also after the event loop is gone.

Imported by ``console_scale.py``, which puts the repository root and ``benchmarks/`` on
``sys.path`` first.
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncssh
import psutil

SSHD = "/usr/sbin/sshd"
START_TIMEOUT_S = 10.0
PROBE_LOGGED = "kex_exchange_identification: read: Connection reset by peer"
FIRST_ADDRESS = 20
"""The listeners take 127.0.0.20, .21, ...: away from tests/sshbed.py's hosts (from .2)."""


def raise_fd_limit() -> tuple[int, int]:
    """The soft open-file limit up to the hard one (sshd and the executors inherit it)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def _write_key(path: Path) -> str:
    """A fresh ed25519 key pair at ``path`` (0600); its public line."""
    key = asyncssh.generate_private_key("ssh-ed25519")
    key.write_private_key(str(path))
    path.chmod(0o600)
    return key.export_public_key().decode().strip()


def _free_port(address: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((address, 0))
        return int(s.getsockname()[1])


def _banner(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=0.5) as s:
            return s.recv(8).startswith(b"SSH-2.0")
    except OSError:
        return False


@dataclass
class Listener:
    address: str
    port: int
    folder: Path
    public_key: str
    proc: subprocess.Popen[bytes] | None = None
    log_from: int = 0
    """Where the log stood once sshd greeted (what it logged while starting is not counted)."""

    @property
    def log(self) -> Path:
        return self.folder / "sshd.log"


class SshdFleet:
    """``servers`` sshd listeners holding ``hosts`` connections between them."""

    def __init__(self, folder: Path, servers: int, hosts: int) -> None:
        self.folder = folder
        self.hosts = hosts
        self.client_key = folder / "client_key"
        self.authorized_keys = folder / "authorized_keys"
        self.known_hosts = folder / "known_hosts"
        folder.mkdir(parents=True, exist_ok=True)
        self.authorized_keys.write_text(_write_key(self.client_key) + "\n")
        self.listeners: list[Listener] = []
        for k in range(max(1, servers)):
            address = f"127.0.0.{FIRST_ADDRESS + k}"
            sub = folder / f"sshd{k}"
            sub.mkdir()
            self.listeners.append(
                Listener(address, _free_port(address), sub, _write_key(sub / "host_key"))
            )
        self.known_hosts.write_text(
            "".join(f"[{x.address}]:{x.port} {x.public_key}\n" for x in self.listeners)
        )
        self._seen: dict[int, psutil.Process] = {}
        """Every sshd process found so far (listeners and sessions), by pid, to kill on stop."""

    def _config(self, x: Listener) -> str:
        lines = [
            f"ListenAddress {x.address}",
            f"Port {x.port}",
            f"HostKey {x.folder / 'host_key'}",
            f"PidFile {x.folder / 'sshd.pid'}",
            f"AuthorizedKeysFile {self.authorized_keys}",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "UsePAM no",
            "StrictModes no",
            "PermitRootLogin prohibit-password",
            "AllowStreamLocalForwarding yes",
            "AllowTcpForwarding yes",
            "X11Forwarding no",
            "PermitTTY no",
            # Every host may be mid-handshake at once (the console dials them together), and a
            # connection carries the link plus the transport's exec channels (8 at most).
            f"MaxStartups {self.hosts + 64}",
            "MaxSessions 32",
            "LoginGraceTime 120",
            "ClientAliveInterval 0",
            "PrintMotd no",
            "UseDNS no",
            "LogLevel ERROR",
        ]
        return "\n".join(lines) + "\n"

    def start(self) -> None:
        """Start every listener and wait until each greets; raise with its log if one won't."""
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # privilege separation folder
        for x in self.listeners:
            config = x.folder / "sshd_config"
            config.write_text(self._config(x))
            with open(x.log, "ab") as log:
                x.proc = subprocess.Popen(
                    [SSHD, "-D", "-e", "-f", str(config)],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                )
            with contextlib.suppress(psutil.Error):
                self._seen[x.proc.pid] = psutil.Process(x.proc.pid)
        for x in self.listeners:
            assert x.proc is not None
            deadline = time.monotonic() + START_TIMEOUT_S
            while not _banner(x.address, x.port):
                if x.proc.poll() is not None or time.monotonic() > deadline:
                    out = x.log.read_text(errors="replace").strip()
                    self.stop()
                    raise RuntimeError(f"sshd on {x.address}:{x.port} did not start: {out}")
                time.sleep(0.01)
            with contextlib.suppress(OSError):
                x.log_from = x.log.stat().st_size

    def host_table(self, i: int) -> dict[str, Any]:
        """The ssh part of host ``i``'s ``[hosts.NAME]`` table: its listener, the client key and
        the known_hosts that lists every listener's key."""
        x = self.listeners[i % len(self.listeners)]
        return {
            "transport": "ssh",
            "address": x.address,
            "port": x.port,
            "user": "root",
            "identity": str(self.client_key),
            "known_hosts": str(self.known_hosts),
        }

    def processes(self) -> list[psutil.Process]:
        """The listeners and their session processes now (remembered for ``stop``)."""
        found: list[psutil.Process] = []
        for x in self.listeners:
            if x.proc is None or x.proc.poll() is not None:
                continue
            with contextlib.suppress(psutil.Error):
                top = self._seen.get(x.proc.pid) or psutil.Process(x.proc.pid)
                found.append(top)
                found.extend(top.children(recursive=True))
        for p in found:
            self._seen.setdefault(p.pid, p)
        return found

    def sessions(self) -> int:
        """Connections sshd holds: each forks one process (and an unprivileged child while it
        authenticates), so this counts the listeners' direct children."""
        n = 0
        for x in self.listeners:
            if x.proc is not None and x.proc.poll() is None:
                with contextlib.suppress(psutil.Error):
                    n += len(psutil.Process(x.proc.pid).children())
        return n

    def cpu_s(self) -> float:
        """CPU seconds (user + system) of every sshd process alive now: what the hosts' sshd
        spends, here on the console's machine. Sessions live through a measured window, so a
        difference of two readings is that window's sshd CPU."""
        total = 0.0
        for p in self.processes():
            with contextlib.suppress(psutil.Error):
                t = p.cpu_times()
                total += t.user + t.system
        return total

    def rss_mib(self) -> float:
        """Unique memory (USS) of every sshd process, MiB: what each connection costs a host."""
        total = 0
        for p in self.processes():
            with contextlib.suppress(psutil.Error):
                total += p.memory_full_info().uss
        return total / 2**20

    def errors(self) -> str:
        """The first lines sshd logged (LogLevel ERROR) since it started, and how many."""
        lines: list[str] = []
        for x in self.listeners:
            with contextlib.suppress(OSError), x.log.open("rb") as f:
                f.seek(x.log_from)
                mine = [ln for ln in f.read().decode(errors="replace").splitlines() if ln]
            # The start's banner probe hung up before the key exchange (logged late, maybe).
            with contextlib.suppress(ValueError):
                mine.remove(PROBE_LOGGED)
            lines += mine
        return f"{len(lines)} lines: " + "; ".join(lines[:3]) if lines else ""

    def stop(self) -> None:
        """SIGKILL every sshd process started or found here, by pid; reap the listeners."""
        with contextlib.suppress(Exception):  # stopping anyway
            self.processes()
        for p in self._seen.values():
            with contextlib.suppress(psutil.Error, OSError):
                if p.is_running():
                    os.kill(p.pid, signal.SIGKILL)
        for x in self.listeners:
            if x.proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    x.proc.wait(timeout=5)
        psutil.wait_procs([p for p in self._seen.values() if p.is_running()], timeout=5)
