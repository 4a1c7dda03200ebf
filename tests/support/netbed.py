"""Test hosts behind a network link the test can cut: sshd inside a network namespace of its own.

Each namespace gets a veth pair and a private /24 (10.213.N.0/24: .1 here, .2 inside); only
these addresses are ever targets. ``cut()`` downs the link (packets vanish, nothing resets),
``heal()`` brings it back.

A *routed* namespace (``routed=True``) also reaches the other routed namespaces, through this
one, as hosts of a multi-host job reach each other: a default route via its 10.213.N.1, and
forwarding on for packets that arrive on its veth (``net.ipv4.conf.<veth>.forwarding``, not the
machine-wide ``ip_forward``, so nothing global changes and deleting the veth undoes it). Policy
rules keep forwarded packets on the test's own links: they may use the main table's routes but
not its default route; one for a cut namespace (10.213.0.0/16 with no link up) is dropped, so
packets to it vanish here instead of leaving by the default route; one for anywhere else is
refused at once (ICMP unreachable), as with no route at all, so a namespace's DNS lookups fail
fast instead of timing out. A routed namespace never reaches past this machine.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from support.sshbed import SshBed, SshHost
from support.wait import flocked

NETWORK = "10.213.0.0/16"
RULE_PREF = 2130
"""Priority of a routed namespace's first policy rule (ahead of ``main`` at 32766)."""


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False, timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


def _quiet_ip(*args: str) -> None:
    subprocess.run(["ip", *args], capture_output=True, check=False, timeout=30)


def unavailable() -> str | None:
    """Why namespaces cannot be made here (not root, no ``ip``), or None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "no ip command (iproute2)"
    return None


def forward_blocked() -> str | None:
    """A firewall whose FORWARD policy drops (iptables or nftables), which would eat the traffic
    between routed namespaces; None when none is found. Changing a firewall is not a test's
    business, so a caller skips with this reason."""
    probes = [["iptables", "-S", "FORWARD"], ["nft", "list", "ruleset"]]
    for argv in probes:
        if shutil.which(argv[0]) is None:
            continue
        done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=30)
        text = done.stdout
        if "-P FORWARD DROP" in text:
            return "the iptables FORWARD policy is DROP"
        for line in text.splitlines():
            if "hook forward" in line and "policy drop" in line:
                return "an nftables forward chain has policy drop"
    return None


LOCK = Path(tempfile.gettempdir()) / "hotspare-netbed.lock"
"""Held while a namespace picks its /24 and takes it, by every process making one here: two
tests side by side never pick the same (two veths with one address route to either sshd, and
the client then meets a host key that "CHANGED": a chaos run at 982d54b hung that way)."""


@contextlib.contextmanager
def _claiming(timeout: float = 60.0) -> Iterator[set[int]]:
    """The values of N whose 10.213.N.0/24 an interface here uses now, with the lock held."""
    with flocked(LOCK, timeout):
        argv = ["ip", "-4", "-o", "addr", "show"]
        done = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=30)
        yield {
            int(word.split(".")[2])
            for word in done.stdout.split()
            if word.startswith("10.213.") and word.count(".") == 3
        }


class NetNs:
    """A namespace on a 10.213.N.0/24 no interface here used when it was made (N picked from a
    point that depends on this process, so tests side by side rarely wait on each other)."""

    def __init__(self, routed: bool = False) -> None:
        with _claiming() as taken:
            start = 100 + (os.getpid() * 7) % 150
            free = (n for n in [*range(start, 250), *range(2, start)] if n not in taken)
            index = next(free, None)
            if index is None:
                raise RuntimeError("every 10.213.N.0/24 network here is in use")
            self._make(index, routed)

    def _make(self, index: int, routed: bool) -> None:
        tag = f"{os.getpid() % 10000}x{index}"
        self.name = f"hs{tag}"
        self.outside = f"hso{tag}"[:15]
        self.inside = f"hsi{tag}"[:15]
        self.local = f"10.213.{index}.1"
        self.address = f"10.213.{index}.2"
        self.routed = routed
        _ip("netns", "add", self.name)
        try:
            _ip("link", "add", self.outside, "type", "veth", "peer", "name", self.inside)
            _ip("link", "set", self.inside, "netns", self.name)
            _ip("addr", "add", f"{self.local}/24", "dev", self.outside)
            _ip("link", "set", self.outside, "up")
            _ip("-n", self.name, "addr", "add", f"{self.address}/24", "dev", self.inside)
            _ip("-n", self.name, "link", "set", self.inside, "up")
            _ip("-n", self.name, "link", "set", "lo", "up")
            if routed:
                self._route()
        except (RuntimeError, OSError):
            self.delete()
            raise

    def _route(self) -> None:
        _ip("-n", self.name, "route", "add", "default", "via", self.local)
        Path(f"/proc/sys/net/ipv4/conf/{self.outside}/forwarding").write_text("1\n")
        self._drop_rules()  # a crashed run's, on a reused name
        rule = ["rule", "add", "iif", self.outside]
        _ip(*rule, "lookup", "main", "suppress_prefixlength", "0", "pref", str(RULE_PREF))
        _ip(*rule, "to", NETWORK, "blackhole", "pref", str(RULE_PREF + 1))
        _ip(*rule, "unreachable", "pref", str(RULE_PREF + 2))

    def _drop_rules(self) -> None:
        for pref in range(RULE_PREF, RULE_PREF + 3):
            _quiet_ip("rule", "del", "iif", self.outside, "pref", str(pref))

    def argv(self, *command: str) -> list[str]:
        """``command`` run inside this namespace."""
        return ["ip", "netns", "exec", self.name, *command]

    def cut(self) -> None:
        _ip("link", "set", self.outside, "down")

    def heal(self) -> None:
        _ip("link", "set", self.outside, "up")

    def delete(self) -> None:
        if self.routed:
            self._drop_rules()
        _quiet_ip("link", "del", self.outside)
        _quiet_ip("netns", "del", self.name)


@contextlib.contextmanager
def routed_namespaces(count: int) -> Iterator[list[NetNs]]:
    """``count`` routed namespaces on free /24s, all deleted on the way out, even after a
    failure (a namespace's processes must be gone by then: the caller's job)."""
    made: list[NetNs] = []
    try:
        for _ in range(count):
            made.append(NetNs(routed=True))
        yield made
    finally:
        for ns in made:
            ns.delete()


class NsSshHost(SshHost):
    """An sshd on port 22 of its own namespace, reached at 10.213.N.2."""

    def __init__(self, bed: SshBed, n: int, name: str, routed: bool = False) -> None:
        super().__init__(bed, n, name)
        self.netns = NetNs(routed)
        self.address = self.netns.address
        self.port = 22
        self._write_config()

    @property
    def known_hosts_line(self) -> str:
        return f"{self.address} {self.public_key}"  # port 22: no [host]:port form

    def sshd_argv(self) -> list[str]:
        return self.netns.argv(*super().sshd_argv())

    def stop(self) -> None:
        super().stop()
        self.netns.delete()


def ns_host(bed: SshBed, name: str, routed: bool = False) -> NsSshHost:
    """A namespaced host added to the bed (and its known_hosts), started; ``routed``: it also
    reaches the bed's other routed hosts."""
    taken = {int(h.address.rsplit(".", 1)[1]) for h in bed.hosts if h.address.startswith("127.")}
    n = next(i for i in range(2, 250) if i not in taken)
    host = NsSshHost(bed, n, name, routed)
    bed.hosts.append(host)
    with open(bed.known_hosts, "a") as f:
        f.write(host.known_hosts_line + "\n")
    host.start()
    return host
