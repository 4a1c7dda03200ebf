"""Real OpenSSH hosts on loopback addresses, for tests and benchmarks.

Each ``SshHost`` is an ``sshd -D`` of its own on 127.0.0.N: its own port, host key,
sshd_config, pid file and ``root`` folder (the host's disk for hotspare). A ``SshBed`` holds
what the hosts share: one client key pair authorized on all of them, and a ``known_hosts``
listing every host key, so the client side verifies keys exactly as it would in production.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import asyncssh
import psutil

SSHD = "/usr/sbin/sshd"
SSHD_PROVISIONER = Path(__file__).resolve().parents[2] / "examples" / "provision_sshd.py"
"""The shipped provisioner that starts a fresh sshd host on this machine."""
START_TIMEOUT = 10.0


class SshdError(RuntimeError):
    """sshd would not start; the message carries its own error output."""


def _write_key(path: Path) -> str:
    """A fresh ed25519 key pair at ``path`` (private, 0600) and ``path.pub``; the public line."""
    key = asyncssh.generate_private_key("ssh-ed25519")
    key.write_private_key(str(path))
    path.chmod(0o600)
    public = key.export_public_key().decode().strip()
    path.with_suffix(".pub").write_text(public + "\n")
    return public


def _free_port(address: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((address, 0))
        return int(s.getsockname()[1])


@cache
def _supports(option: str) -> bool:
    """Whether this sshd knows a config keyword (PerSourcePenalties is 9.8+)."""
    with tempfile.TemporaryDirectory() as d:
        key = Path(d, "k")
        _write_key(key)
        conf = Path(d, "c")
        conf.write_text(f"HostKey {key}\n{option}\n")
        done = subprocess.run([SSHD, "-t", "-f", str(conf)], capture_output=True, check=False)
        return done.returncode == 0


def _banner(address: str, port: int) -> bool:
    """True once sshd accepts a connection and says SSH-2.0."""
    try:
        with socket.create_connection((address, port), timeout=0.5) as s:
            return s.recv(8).startswith(b"SSH-2.0")
    except OSError:
        return False


class SshHost:
    """One sshd on 127.0.0.N; ``start`` again after ``kill_all`` brings it back on the same port."""

    def __init__(self, bed: SshBed, n: int, name: str) -> None:
        self.bed = bed
        self.name = name
        self.address = f"127.0.0.{n}"
        self.folder = bed.folder / name
        self.root = self.folder / "root"
        self.host_key = self.folder / "host_key"
        self.config = self.folder / "sshd_config"
        self.pid_file = self.folder / "sshd.pid"
        self.log = self.folder / "sshd.log"
        self.folder.mkdir(parents=True)
        self.root.mkdir()
        self.public_key = _write_key(self.host_key)
        self.port = _free_port(self.address)
        self.proc: subprocess.Popen[bytes] | None = None
        self._write_config()

    def _write_config(self) -> None:
        lines = [
            f"ListenAddress {self.address}",
            f"Port {self.port}",
            f"HostKey {self.host_key}",
            f"PidFile {self.pid_file}",
            f"AuthorizedKeysFile {self.bed.authorized_keys}",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "UsePAM no",
            "StrictModes no",
            "PermitRootLogin prohibit-password",
            "AllowStreamLocalForwarding yes",
            "AllowTcpForwarding yes",
            "Subsystem sftp internal-sftp",
            "MaxSessions 64",
            "MaxStartups 64",
            "PrintMotd no",
            "UseDNS no",
            "LogLevel ERROR",
            # bash sources ~/.bashrc for sshd sessions only at SHLVL 0: this machine's
            # .bashrc (pyenv init) would add ~150 ms to every command.
            "SetEnv SHLVL=1",
        ]
        if _supports("PerSourcePenalties no"):
            lines.append("PerSourcePenalties no")
        self.config.write_text("\n".join(lines) + "\n")

    @property
    def known_hosts_line(self) -> str:
        return f"[{self.address}]:{self.port} {self.public_key}"

    def sshd_argv(self) -> list[str]:
        return [SSHD, "-D", "-e", "-f", str(self.config)]

    def start(self) -> None:
        """Start sshd and wait until it greets; raise ``SshdError`` with its output if it won't."""
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation dir
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                self.sshd_argv(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
            )
        deadline = time.monotonic() + START_TIMEOUT
        while not _banner(self.address, self.port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill_all()
                output = self.log.read_text(errors="replace").strip()
                raise SshdError(
                    f"sshd for {self.name} on {self.address}:{self.port} did not start: {output}"
                )
            time.sleep(0.005)

    def processes(self) -> list[psutil.Process]:
        """sshd, its session children, and anything running under this host's root folder."""
        found: dict[int, psutil.Process] = {}
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(psutil.Error):
                top = psutil.Process(self.proc.pid)
                found[top.pid] = top
                for child in top.children(recursive=True):
                    found[child.pid] = child
        me = psutil.Process()
        spared = {me.pid, *(p.pid for p in me.parents()), *(p.pid for p in me.children(True))}
        root = str(self.root)
        for p in psutil.process_iter():
            if p.pid in spared or p.pid in found:
                continue
            with contextlib.suppress(psutil.Error):
                if _mentions(p, root):
                    found[p.pid] = p
                    for child in p.children(recursive=True):
                        found[child.pid] = child
        return list(found.values())

    def kill_all(self) -> None:
        """The host dies: SIGKILL sshd, its sessions and every process started under its root."""
        doomed = self.processes()
        for p in doomed:
            with contextlib.suppress(psutil.Error):
                p.send_signal(signal.SIGKILL)
        _wait_gone(doomed, timeout=5)
        if self.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=5)
            self.proc = None

    def stop(self) -> None:
        """Tear down: sshd and what ran there are gone; the folder stays for the test to read."""
        self.kill_all()

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def inventory_table(self, region: str = "r1", **extra: Any) -> dict[str, Any]:
        """A ``[hosts.NAME]`` table that reaches this host over ssh with the bed's key."""
        table: dict[str, Any] = {
            "region": region,
            "transport": "ssh",
            "address": self.address,
            "port": self.port,
            "user": "root",
            "identity": str(self.bed.client_key),
            "known_hosts": str(self.bed.known_hosts),
            "root": str(self.root),
            "python": sys.executable,
        }
        table.update(extra)
        return table


def _wait_gone(procs: list[psutil.Process], timeout: float) -> None:
    """Wait until each process has exited; a zombie counts (init reaps it when it likes)."""
    deadline = time.monotonic() + timeout
    for p in procs:
        while time.monotonic() < deadline:
            try:
                if p.status() == psutil.STATUS_ZOMBIE:
                    break
            except psutil.NoSuchProcess:
                break
            time.sleep(0.005)


def _mentions(p: psutil.Process, root: str) -> bool:
    """Whether a process runs in, was started with, or has in its environment ``root``."""
    prefix = root + os.sep
    cwd = p.cwd()
    if cwd == root or cwd.startswith(prefix):
        return True
    if any(root in arg for arg in p.cmdline()):
        return True
    return any(root in value for value in p.environ().values())


class SshBed:
    """A folder of sshd hosts sharing one client key and one known_hosts."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.client_key = folder / "client_key"
        self.authorized_keys = folder / "authorized_keys"
        self.known_hosts = folder / "known_hosts"
        self.hosts: list[SshHost] = []
        folder.mkdir(parents=True, exist_ok=True)
        self.client_public = _write_key(self.client_key)
        self.authorized_keys.write_text(self.client_public + "\n")
        self.known_hosts.write_text("")

    def host(self, n: int | None = None, *, name: str | None = None, start: bool = True) -> SshHost:
        """A new host on 127.0.0.N (the next free N from 2 when not given), listed in known_hosts."""
        if n is None:
            taken = {int(h.address.rsplit(".", 1)[1]) for h in self.hosts}
            n = next(i for i in range(2, 250) if i not in taken)
        host = SshHost(self, n, name or f"h{n}")
        self.hosts.append(host)
        with open(self.known_hosts, "a") as f:
            f.write(host.known_hosts_line + "\n")
        if start:
            host.start()
        return host

    def sshd_provisioner(self, root: Path, region: str = "r1") -> tuple[list[str], list[str]]:
        """``examples/provision_sshd.py`` for this bed: the command that makes a fresh sshd
        host under ``root`` trusting the bed's client key (its host key added to the bed's
        known_hosts), and the release command (the host's name to append)."""
        argv = [sys.executable, str(SSHD_PROVISIONER), "--root", str(root)]
        command = [
            *argv,
            *("--authorized-keys", str(self.authorized_keys), "--identity", str(self.client_key)),
            *("--known-hosts", str(self.known_hosts), "--region", region),
        ]
        return command, [*argv, "--release"]

    def ssh_options(self) -> list[str]:
        """Options for the OpenSSH client (ssh, scp) that trust exactly this bed."""
        return [
            "-i",
            str(self.client_key),
            "-o",
            f"UserKnownHostsFile={self.known_hosts}",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            "BatchMode=yes",
            "-F",
            "/dev/null",
        ]

    def stop(self) -> None:
        for host in self.hosts:
            host.stop()


@contextlib.contextmanager
def ssh_bed(folder: Path | None = None) -> Iterator[SshBed]:
    """An ``SshBed`` in a short temp folder (Unix socket paths stay under 108 bytes), torn down after."""
    own = folder is None
    path = Path(tempfile.mkdtemp(prefix="sb-", dir="/tmp")) if folder is None else folder
    bed = SshBed(path)
    try:
        yield bed
    finally:
        bed.stop()
        if own:
            shutil.rmtree(path, ignore_errors=True)
