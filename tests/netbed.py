"""Test hosts behind a network link the test can cut: sshd inside a network namespace of its own.

Each namespace gets a veth pair and a private /24 (10.213.N.0/24: .1 here, .2 inside); only
these addresses are ever targets. ``cut()`` downs the link (packets vanish, nothing resets),
``heal()`` brings it back.
"""

from __future__ import annotations

import os
import subprocess

from sshbed import SshBed, SshHost


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


class NetNs:
    def __init__(self, index: int) -> None:
        tag = f"{os.getpid() % 10000}x{index}"
        self.name = f"hs{tag}"
        self.outside = f"hso{tag}"[:15]
        self.inside = f"hsi{tag}"[:15]
        self.local = f"10.213.{index}.1"
        self.address = f"10.213.{index}.2"
        _ip("netns", "add", self.name)
        try:
            _ip("link", "add", self.outside, "type", "veth", "peer", "name", self.inside)
            _ip("link", "set", self.inside, "netns", self.name)
            _ip("addr", "add", f"{self.local}/24", "dev", self.outside)
            _ip("link", "set", self.outside, "up")
            _ip("-n", self.name, "addr", "add", f"{self.address}/24", "dev", self.inside)
            _ip("-n", self.name, "link", "set", self.inside, "up")
            _ip("-n", self.name, "link", "set", "lo", "up")
        except RuntimeError:
            self.delete()
            raise

    def cut(self) -> None:
        _ip("link", "set", self.outside, "down")

    def heal(self) -> None:
        _ip("link", "set", self.outside, "up")

    def delete(self) -> None:
        subprocess.run(["ip", "link", "del", self.outside], capture_output=True, check=False)
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True, check=False)


class NsSshHost(SshHost):
    """An sshd on port 22 of its own namespace, reached at 10.213.N.2."""

    def __init__(self, bed: SshBed, n: int, name: str, index: int) -> None:
        super().__init__(bed, n, name)
        self.netns = NetNs(index)
        self.address = self.netns.address
        self.port = 22
        self._write_config()

    @property
    def known_hosts_line(self) -> str:
        return f"{self.address} {self.public_key}"  # port 22: no [host]:port form

    def sshd_argv(self) -> list[str]:
        return ["ip", "netns", "exec", self.netns.name, *super().sshd_argv()]

    def stop(self) -> None:
        super().stop()
        self.netns.delete()


def ns_host(bed: SshBed, index: int, name: str) -> NsSshHost:
    """A namespaced host added to the bed (and its known_hosts), started."""
    taken = {int(h.address.rsplit(".", 1)[1]) for h in bed.hosts if h.address.startswith("127.")}
    n = next(i for i in range(2, 250) if i not in taken)
    host = NsSshHost(bed, n, name, index)
    bed.hosts.append(host)
    with open(bed.known_hosts, "a") as f:
        f.write(host.known_hosts_line + "\n")
    host.start()
    return host
