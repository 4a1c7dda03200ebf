"""Talking to the programs a host-to-host copy runs on its hosts (``direct_host``,
``direct_sender``): one JSON line at a time, each read under a timeout, and what each answer
means as the transport's errors, or as ``NotDirect`` when the spare was never reached.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
from pathlib import Path
from typing import Any

from console.reach.transport.base import (
    DiskUsage,
    PermanentTransportError,
    TemporaryTransportError,
    TransportError,
)
from console.reach.transport.files import TransferCorrupt
from console.reach.transport.ssh import SshTransport
from console.replication import direct_host
from console.replication.direct_keys import NotDirect
from console.replication.replica import SpareDiskFull
from protocol.units import size

HOST_PROGRAM = Path(direct_host.__file__).read_text()


async def ask(
    t: SshTransport, python: str, order: dict[str, Any], what: str
) -> tuple[dict[str, Any], Any]:
    """``direct_host`` run on a host with ``order`` on its stdin (never its command line);
    its answer and the connection it ran over."""
    limit = t.default_timeout
    argv = ["timeout", "-s", "KILL", str(math.ceil(limit) + 2), python, "-I", "-S", "-c"]
    async with t.process([*argv, HOST_PROGRAM], what, limit) as proc:
        conn = proc.get_extra_info("connection")
        with t.errors(what, limit):
            proc.stdin.write(json.dumps(order).encode() + b"\n")
            proc.stdin.write_eof()
        got = await answer(t, proc, what, limit, before=False)
    if not got.get("ok"):
        raise PermanentTransportError(
            f"{t.name}: {what}: {got.get('error', 'no answer')}", errno=got.get("errno")
        )
    return got, conn


async def answer(
    t: SshTransport, proc: Any, what: str, limit: float, *, before: bool
) -> dict[str, Any]:
    """The next JSON line; what the program said on stderr when there is none. ``before``:
    nothing reached the spare yet, so silence or a dead program means the relay."""
    line = b""
    try:
        with t.errors(what, limit):
            async with asyncio.timeout(limit):
                line = await proc.stdout.readline()
    except TransportError as e:
        if before:
            raise NotDirect(str(e)) from None
        raise
    if line:
        try:
            got = json.loads(line)
        except ValueError:
            got = None
        if isinstance(got, dict):
            return got
        raise PermanentTransportError(f"{t.name}: {what}: odd output {line[:80]!r}")
    err = b""
    with contextlib.suppress(Exception):
        async with asyncio.timeout(1.0):
            await proc.wait_closed()
            err = await proc.stderr.read()
    text = err.decode(errors="replace").strip().splitlines()
    reason = text[-1] if text else f"exit status {proc.returncode}"
    if before:
        raise NotDirect(f"{t.name}: {what}: {reason}")
    raise TemporaryTransportError(f"{t.name}: {what}: {reason}")


def refused(source: str, spare: str, what: str, said: dict[str, Any]) -> None:
    """The sender's own first words: the spare out of reach (the relay), the source's file
    unreadable (a failed copy)."""
    if "reach" in said:
        raise NotDirect(f"{spare} not reached from {source}: {said['reach']}")
    if "source" in said:
        raise PermanentTransportError(
            f"{source}: {what}: {said['source']}", errno=said.get("errno")
        )


def disk(fields: list[int]) -> DiskUsage:
    free, total, block = fields
    return DiskUsage(free=free, total=total, block=block)


def failed(spare: str, what: str, said: dict[str, Any]) -> TransportError:
    """What the receiver (or the sender, for a connection lost mid-copy) said went wrong."""
    if said.get("full"):
        return SpareDiskFull(
            f"{spare}: disk full: {size(said['disk'][0])} free; the replica needs "
            f"{size(said['need'])} and {size(said['reserve'])} must stay free"
        )
    if "error" in said:
        return PermanentTransportError(
            f"{spare}: {said.get('what') or what}: {said['error']}", errno=said.get("errno")
        )
    if "corrupt" in said:
        return TransferCorrupt(
            f"{spare}: {what}: sha256 {str(said['corrupt'])[:12]}… does not match"
        )
    for word in ("short", "timeout", "lost"):
        if word in said:
            return TemporaryTransportError(f"{spare}: {what}: {word}: {said[word]}")
    return PermanentTransportError(f"{spare}: {what}: odd said {json.dumps(said)[:120]}")
