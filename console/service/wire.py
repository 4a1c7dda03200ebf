"""The control socket's words: one JSON object per line each way, a request then its reply.

A view (``hotspare`` attached to a running controller) and ``hotspare stop`` speak it to the
controller service over a Unix socket in the state dir. Requests::

    {"op": "hello"}                                   -> who the controller is
    {"op": "call", "method": "stop_job", "args": ["demo"]}   -> an operator action
    {"op": "status"}                                  -> each job's state as the controller has it
    {"op": "stop"}                                    -> the controller closes and exits

Replies carry ``ok``; a refused action carries ``refused`` (the one-line reason), any other
failure ``error``.
"""

from __future__ import annotations

from typing import Any

import msgspec

SOCKET_NAME = "control.sock"
MAX_LINE = 1 << 20
"""The longest request or reply line read (an add-host table, a status of many jobs)."""

CALLS = frozenset(
    {
        "fail_over",
        "approve",
        "deny",
        "checkpoint_now",
        "stop_job",
        "start_job",
        "drain_host",
        "undrain",
        "cordon",
        "uncordon",
        "kill_host",
        "revive_host",
        "add_host",
    }
)
"""The controller's operator actions a view may call, and nothing else."""


class Request(msgspec.Struct, omit_defaults=True):
    op: str
    method: str = ""
    args: list[Any] = msgspec.field(default_factory=list)


class Reply(msgspec.Struct, omit_defaults=True):
    ok: bool
    refused: str = ""
    error: str = ""
    data: dict[str, Any] = msgspec.field(default_factory=dict)


def encode(msg: Request | Reply) -> bytes:
    return msgspec.json.encode(msg) + b"\n"


def decode_request(line: bytes) -> Request:
    return msgspec.json.decode(line, type=Request)


def decode_reply(line: bytes) -> Reply:
    return msgspec.json.decode(line, type=Reply)


__all__ = ["CALLS", "MAX_LINE", "SOCKET_NAME", "Reply", "Request", "decode_reply", "decode_request"]
