"""A stalled TCP connection told from a slow one, from the kernel's own account: a peer whose
link is cut acknowledges nothing (stalled); a peer process that is stopped still has its kernel
acknowledge (slow, kept). Real sockets, a real namespace and a real link cut."""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from support import netbed
from support.wait import wait_for as until

from console.reach.transport.tcp_stall import stalled

pytestmark = pytest.mark.skipif(netbed.unavailable() is not None, reason=str(netbed.unavailable()))

STALL_S = 0.5
PORT = 7411
# A peer that accepts one connection and reads nothing (its kernel buffers and acknowledges).
PEER = (
    "import socket, sys, time\n"
    "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    f"s.bind(('0.0.0.0', {PORT})); s.listen(1); print('up', flush=True)\n"
    "c, _ = s.accept(); time.sleep(3600)\n"
)


@contextlib.contextmanager
def peer_in_namespace() -> Iterator[tuple[netbed.NetNs, subprocess.Popen[bytes], socket.socket]]:
    ns = netbed.NetNs()
    proc = subprocess.Popen(ns.argv(sys.executable, "-c", PEER), stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"up\n"
        sock = socket.create_connection((ns.address, PORT), timeout=5)
        try:
            yield ns, proc, sock
        finally:
            sock.close()
    finally:
        proc.kill()
        proc.wait(timeout=10)
        ns.delete()


def test_data_unacknowledged_past_the_stall_time_over_a_cut_link_is_stalled() -> None:
    with peer_in_namespace() as (ns, _, sock):
        sock.sendall(b"x" * 1000)
        assert not stalled(sock, STALL_S), "a healthy connection, its data acknowledged"
        ns.cut()
        sock.sendall(b"y" * 1000)  # in flight, never acknowledged while the link is down
        until(lambda: stalled(sock, STALL_S), 10, "the connection to read as stalled")
        ns.heal()
        # The kernel's next retransmission is acknowledged, and the connection is whole again.
        until(lambda: not stalled(sock, STALL_S), 30, "the retransmission acknowledged")


def test_a_peer_that_is_stopped_but_whose_kernel_acknowledges_is_not_stalled() -> None:
    with peer_in_namespace() as (_, proc, sock):
        proc.send_signal(signal.SIGSTOP)  # a loaded or frozen process: its kernel still acks
        try:
            sock.sendall(b"z" * 1000)
            deadline = time.monotonic() + 4 * STALL_S
            while time.monotonic() < deadline:  # looked at over 4 stall times: never stalled
                assert not stalled(sock, STALL_S)
                time.sleep(0.05)
        finally:
            proc.send_signal(signal.SIGCONT)


def test_what_cannot_be_told_is_not_stalled() -> None:
    assert not stalled(None)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as unix:
        assert not stalled(unix), "not TCP"
