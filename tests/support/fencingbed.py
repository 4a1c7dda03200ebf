"""A real ``serve`` executor under leases in the fencing tests: started (a fault injected or
not) and answered by a console's side of its socket, which reads with a short timeout so the
test's renewals keep pace."""

from __future__ import annotations

import socket
from pathlib import Path

from protocol import EXECUTOR_MESSAGES, PROTOCOL_VERSION, recv_message, send_message
from protocol.messages import ConsoleHello, ExecutorMessage
from support.helpers import ExecutorProcess, env_with, wait_for


class Client:
    """A console's side of the socket, reading with a short timeout so renewals keep pace."""

    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(10)
        self.sock.connect(str(path))
        send_message(self.sock, ConsoleHello(version=PROTOCOL_VERSION, console_id="fencing"))
        recv_message(self.sock, EXECUTOR_MESSAGES)

    def send(self, msg: object) -> None:
        send_message(self.sock, msg)

    def recv(self) -> ExecutorMessage:
        msg = recv_message(self.sock, EXECUTOR_MESSAGES)
        assert msg is not None, "the executor closed the connection"
        return msg

    def close(self) -> None:
        self.sock.close()


def start_serving(work: Path, inject: str) -> tuple[ExecutorProcess, Client]:
    env = env_with(HOTSPARE_INJECT=inject) if inject else env_with()
    proc = ExecutorProcess(["serve", "--workdir", str(work), "--heartbeat-s", "0.2"], env=env)

    def answers() -> Client | None:
        if proc.proc.poll() is not None:
            raise AssertionError(f"the executor exited: {proc.finish()[1][-2000:]}")
        try:  # a socket file a killed predecessor left may be there before this one serves
            return Client(work / "executor.sock")
        except OSError:
            return None

    return proc, wait_for(answers, 60, "the executor to serve")
