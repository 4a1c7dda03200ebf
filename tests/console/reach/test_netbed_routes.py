"""tests/netbed.py's routed namespaces reach each other through this one, and a cut link cuts
that traffic too: a TCP listener in namespace A, connected to from namespace B by a separate
python process, says which address it saw the connection come from."""

from __future__ import annotations

import select
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from support import netbed

pytestmark = pytest.mark.skipif(netbed.unavailable() is not None, reason=str(netbed.unavailable()))

PORT = 7411
CONNECT_S = 1.0
"""A cut link drops packets: a connect through it is given this long to fail."""

LISTEN = f"""
import socket, sys
s = socket.create_server((sys.argv[1], {PORT}))
print("listening", flush=True)
while True:
    conn, peer = s.accept()
    conn.sendall(f"{{peer[0]}}\\n".encode())
    conn.close()
"""

CONNECT = """
import socket, sys
try:
    with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])) as s:
        print("saw", s.makefile().readline().strip())
except OSError as e:
    print("failed", type(e).__name__)
"""


@pytest.fixture
def pair() -> Iterator[list[netbed.NetNs]]:
    if why := netbed.forward_blocked():
        pytest.skip(why)
    with netbed.routed_namespaces(2) as made:
        yield made


def listen(ns: netbed.NetNs) -> subprocess.Popen[str]:
    """A listener on ns's address, once it is accepting."""
    proc = subprocess.Popen(
        ns.argv(sys.executable, "-c", LISTEN, ns.address), stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], 20.0)
    if not ready or proc.stdout.readline().strip() != "listening":
        proc.kill()
        proc.wait()
        raise AssertionError(f"no listener in {ns.name}")
    return proc


def connect(source: netbed.NetNs, target: netbed.NetNs) -> str:
    """From inside ``source``: what ``target``'s listener answered, or how connecting failed."""
    argv = source.argv(sys.executable, "-c", CONNECT, target.address, str(PORT), str(CONNECT_S))
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    return done.stdout.strip() or f"no output: {done.stderr.strip()}"


def test_routed_namespaces_reach_each_other_until_a_link_is_cut(pair: list[netbed.NetNs]) -> None:
    a, b = pair
    listeners = [listen(a), listen(b)]
    try:
        # the listener saw B's own address: routed through this namespace, not relayed
        assert connect(b, a) == f"saw {b.address}"
        assert connect(a, b) == f"saw {a.address}"

        a.cut()
        # dropped, not refused: packets vanish both ways, as on a cut cable
        assert connect(b, a) == "failed TimeoutError"
        assert connect(a, b) == "failed TimeoutError"

        a.heal()
        deadline = time.monotonic() + 10.0
        while (seen := connect(b, a)) != f"saw {b.address}" and time.monotonic() < deadline:
            pass
        assert seen == f"saw {b.address}"
        assert connect(a, b) == f"saw {a.address}"
    finally:
        for proc in listeners:
            proc.kill()
            proc.wait()
