"""A command-kind executor in tests: a console's blocking client of its socket (which waits for
the command's start), and what ``/proc`` says of a process (its stat, its live children)."""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

from protocol import EXECUTOR_MESSAGES, PROTOCOL_VERSION, recv_message, send_message
from protocol.messages import ConsoleHello, ExecutorHello, ExecutorMessage, Log
from support.wire import read_until


def proc_stat(pid: int) -> dict[str, Any] | None:
    """state, ppid, pgid, sid from /proc; None once the process is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return {
        "state": fields[0],
        "ppid": int(fields[1]),
        "pgid": int(fields[2]),
        "sid": int(fields[3]),
    }


class Client:
    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(30)
        self.sock.connect(str(path))
        send_message(self.sock, ConsoleHello(version=PROTOCOL_VERSION, console_id="test"))
        assert isinstance(recv_message(self.sock, EXECUTOR_MESSAGES), ExecutorHello)
        self.seen: list[ExecutorMessage] = []

    def until(self, pred: Callable[[ExecutorMessage], bool], timeout: float) -> ExecutorMessage:
        return read_until(self.sock, self.seen, pred, timeout)

    def started(self, timeout: float = 60) -> Log:
        msg = self.until(
            lambda m: isinstance(m, Log) and m.text.startswith("command started"), timeout
        )
        assert isinstance(msg, Log)
        return msg


def children(pid: int) -> list[int]:
    """The live processes whose parent is ``pid``, from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            st = proc_stat(int(entry.name))
            if st is not None and st["ppid"] == pid and st["state"] not in ("Z", "X"):
                found.append(int(entry.name))
    return found
