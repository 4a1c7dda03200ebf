"""Talking to an executor's socket as a console would, in tests: the next message that matches."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

from protocol import EXECUTOR_MESSAGES, recv_message
from protocol.messages import ExecutorMessage


def read_until(
    sock: socket.socket,
    seen: list[ExecutorMessage],
    pred: Callable[[ExecutorMessage], bool],
    timeout: float,
) -> ExecutorMessage:
    """The next message to arrive within ``timeout`` that matches; every one read is kept in
    ``seen``. The executor closing the connection, or nothing matching, fails the test."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        msg = recv_message(sock, EXECUTOR_MESSAGES)
        assert msg is not None, "the executor closed the connection"
        seen.append(msg)
        if pred(msg):
            return msg
    raise AssertionError(f"nothing matched within {timeout}s; last: {seen[-3:]}")
