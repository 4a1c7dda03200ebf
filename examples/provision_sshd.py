#!/usr/bin/env python3
"""A provisioner for hotspare that starts a fresh OpenSSH host on this machine (the tests' one).

    [provisioner]
    command = ["python3", "examples/provision_sshd.py", "--root", "/tmp/sshd-hosts",
               "--authorized-keys", "/tmp/bed/authorized_keys", "--identity", "/tmp/bed/client_key",
               "--known-hosts", "/tmp/bed/known_hosts", "--region", "r1"]
    release = ["python3", "examples/provision_sshd.py", "--root", "/tmp/sshd-hosts", "--release"]

Each run makes a machine as a cloud would, with what a cloud machine has: a new folder under
``--root`` (``prov-1``, ``prov-2``, ...) with its own host key (``ssh-keygen``), an ``sshd``
of its own on a free loopback address of ``--addresses`` and a free port, accepting the keys
in ``--authorized-keys``. Its host key line is appended to ``--known-hosts`` (under a lock),
so the console verifies it as any other; then it prints the ``[hosts.X]`` table as one JSON
object with the host's ``name``. ``--release NAME`` powers it off: its sshd (by the pid it
recorded, checked against its config) and every process started under its folder are killed,
its known_hosts line removed, the folder deleted.

It needs root (sshd's privilege separation) and ``openssh-server``.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import ipaddress
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil

SSHD = "/usr/sbin/sshd"
START_S = 10.0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", required=True, type=Path, help="where each host's folder goes")
    ap.add_argument("--authorized-keys", type=Path, help="keys the new host's sshd accepts")
    ap.add_argument("--identity", type=Path, help="the console's private key (in the table)")
    ap.add_argument("--known-hosts", type=Path, help="the console's known_hosts file")
    ap.add_argument(
        "--region",
        default=os.environ.get("HOTSPARE_REGION") or "r1",
        help="the host's region (default: HOTSPARE_REGION, which the console sets when it "
        "provisions for a region's min_spares, else r1)",
    )
    ap.add_argument("--python", default=sys.executable, help="the host's interpreter")
    ap.add_argument("--addresses", default="127.0.0.200-127.0.0.239", metavar="FIRST-LAST")
    ap.add_argument("--release", metavar="NAME")
    args = ap.parse_args()
    root = args.root.resolve()
    if args.release:
        return release(root, args.release)
    missing = [f for f in ("authorized_keys", "identity", "known_hosts") if not getattr(args, f)]
    if missing:
        ap.error("needs --" + ", --".join(m.replace("_", "-") for m in missing))
    root.mkdir(parents=True, exist_ok=True)
    with _locked(root):
        folder = _new_folder(root)
        address = _free_address(root, args.addresses)
        (folder / "address").write_text(address)
    port = _free_port(address)
    host_key = folder / "host_key"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(host_key)],
        check=True,
        timeout=30,
    )
    config = folder / "sshd_config"
    text = _config(address, port, host_key, folder, args.authorized_keys.resolve())
    config.write_text(text + "PerSourcePenalties no\n")  # OpenSSH 9.8+: no lockout in tests
    if subprocess.run([SSHD, "-t", "-f", str(config)], capture_output=True, timeout=30).returncode:
        config.write_text(text)  # an older sshd without the keyword
    (folder / "root").mkdir()
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    with open(folder / "sshd.log", "ab") as log:
        proc = subprocess.Popen(
            [SSHD, "-D", "-e", "-f", str(config)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,  # lives on after this script, outside its process group
        )
    (folder / "sshd.pid").write_text(str(proc.pid))
    deadline = time.monotonic() + START_S
    while not _greets(address, port):
        if proc.poll() is not None or time.monotonic() > deadline:
            print(f"provision_sshd: sshd on {address}:{port} did not start", file=sys.stderr)
            release(root, folder.name)
            return 1
        time.sleep(0.01)
    public = host_key.with_suffix(".pub").read_text().split()
    with _locked(root):
        with open(args.known_hosts, "a", encoding="utf-8") as f:
            f.write(f"[{address}]:{port} {public[0]} {public[1]} {folder.name}\n")
        (folder / "known_hosts").write_text(str(args.known_hosts.resolve()))
    host = {
        "name": folder.name,
        "region": args.region,
        "transport": "ssh",
        "address": address,
        "port": port,
        "user": "root",
        "identity": str(args.identity.resolve()),
        "known_hosts": str(args.known_hosts.resolve()),
        "root": str(folder / "root"),
        "python": args.python,
    }
    print(json.dumps(host))
    return 0


def release(root: Path, name: str) -> int:
    folder = root / name
    if not name.startswith("prov-") or not (folder / "sshd_config").is_file():
        print(f"provision_sshd: no host {name!r} under {root}", file=sys.stderr)
        return 1
    doomed: dict[int, psutil.Process] = {}
    with contextlib.suppress(OSError, ValueError, psutil.Error):
        sshd = psutil.Process(int((folder / "sshd.pid").read_text()))
        if str(folder / "sshd_config") in sshd.cmdline():  # the pid is still its sshd
            doomed[sshd.pid] = sshd
            doomed.update((c.pid, c) for c in sshd.children(recursive=True))
    inside = str(folder) + os.sep
    for p in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if (p.cwd() + os.sep).startswith(inside):
                doomed[p.pid] = p
                doomed.update((c.pid, c) for c in p.children(recursive=True))
    doomed.pop(os.getpid(), None)
    for p in doomed.values():
        with contextlib.suppress(psutil.Error):
            p.send_signal(signal.SIGKILL)
    psutil.wait_procs(list(doomed.values()), timeout=10)
    with _locked(root):
        with contextlib.suppress(OSError):
            known = Path((folder / "known_hosts").read_text())
            lines = known.read_text(encoding="utf-8").splitlines(keepends=True)
            known.write_text("".join(x for x in lines if not x.rstrip().endswith(f" {name}")))
        shutil.rmtree(folder)
    return 0


@contextlib.contextmanager
def _locked(root: Path) -> Iterator[None]:
    with open(root / ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def _new_folder(root: Path) -> Path:
    n = 1
    while True:
        folder = root / f"prov-{n}"
        try:
            folder.mkdir()
            return folder
        except FileExistsError:
            n += 1


def _free_address(root: Path, span: str) -> str:
    first, _, last = span.partition("-")
    lo, hi = int(ipaddress.ip_address(first)), int(ipaddress.ip_address(last or first))
    taken = {p.read_text() for p in root.glob("prov-*/address")}
    for n in range(lo, hi + 1):
        address = str(ipaddress.ip_address(n))
        if address not in taken:
            return address
    raise SystemExit(f"provision_sshd: every address of {span} is taken")


def _free_port(address: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((address, 0))
        return int(s.getsockname()[1])


def _greets(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=0.5) as s:
            return s.recv(8).startswith(b"SSH-2.0")
    except OSError:
        return False


def _config(address: str, port: int, host_key: Path, folder: Path, keys: Path) -> str:
    lines = [
        f"ListenAddress {address}",
        f"Port {port}",
        f"HostKey {host_key}",
        f"PidFile {folder / 'sshd.daemon.pid'}",
        f"AuthorizedKeysFile {keys}",
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
        "SetEnv SHLVL=1",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
