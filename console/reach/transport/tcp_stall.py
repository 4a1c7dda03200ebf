"""Is a TCP connection stalled: data sent and no acknowledgement for a while (a link cut, the
kernel's retransmissions backed off)? Read from the kernel's own account (``TCP_INFO``).

Why it matters: after a network outage of tens of seconds, a connection kept across it wakes
only at its next retransmission, which exponential backoff may put a minute after the link is
back. Every operation queued on it waits as long, and a host that answers again is taken for
one that does not. A stalled connection is dialled afresh instead; one that is merely slow (a
loaded host, whose kernel still acknowledges at once) is kept.
"""

from __future__ import annotations

import socket
import struct
from typing import Any

STALL_S = 3.0
"""Data unacknowledged, and no acknowledgement received, for this long: stalled."""

# struct tcp_info (linux/tcp.h): eight one-byte fields, then 32-bit ones; those read here are
# tcpi_unacked (the 5th) and tcpi_last_ack_recv (the 13th, milliseconds ago).
_LAYOUT = struct.Struct("=8B13I")


def stalled(sock: Any, stall_s: float = STALL_S) -> bool:
    """Whether ``sock`` (a TCP socket, or None) has had data in flight and no acknowledgement
    for ``stall_s``. False where it cannot be told (not TCP, not Linux, closed)."""
    if sock is None or not hasattr(socket, "TCP_INFO"):
        return False
    try:
        raw = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _LAYOUT.size)
    except (OSError, AttributeError, ValueError):
        return False
    if len(raw) < _LAYOUT.size:
        return False
    fields = _LAYOUT.unpack(raw)
    unacked, last_ack_recv_ms = fields[8 + 4], fields[8 + 12]
    return unacked > 0 and last_ack_recv_ms >= stall_s * 1000
