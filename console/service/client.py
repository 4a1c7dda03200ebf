"""A view's end of the control socket: the controller's actions, called from another process.

``Remote`` has the controller's action methods (``wire.CALLS``) with the same arguments and
the same failures (``Refused`` for an action refused, ``ValueError`` for one that failed), so
the console's action table runs against a controller in this process or in a service alike.
Calls are blocking and short: each waits at most ``CALL_S`` for its answer.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

from console.service.wire import CALLS, MAX_LINE, SOCKET_NAME, Reply, Request, decode_reply, encode
from console.supervise.refusal import Refused
from protocol.errors import HotspareError

CALL_S = 5.0


class ControllerGone(HotspareError, ConnectionError):
    """No controller answers on the state dir's control socket."""

    permanent = False


class Remote:
    def __init__(self, state_dir: Path, *, timeout: float = CALL_S) -> None:
        self.path = state_dir / SOCKET_NAME
        self.timeout = timeout
        self._sock: socket.socket | None = None
        self._buf = b""

    def _connect(self) -> socket.socket:
        if self._sock is None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(self.timeout)
            try:
                sock.connect(str(self.path))
            except OSError as e:
                sock.close()
                raise ControllerGone(
                    f"{self.path}: no controller answers ({e.strerror or e})"
                ) from None
            self._sock, self._buf = sock, b""
        return self._sock

    def close(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()

    def ask(self, req: Request) -> Reply:
        """One request, its reply; else ``ControllerGone``. A broken connection is dialled
        once more (the controller restarted) for a question, never for an action: one that
        may have landed is not sent twice."""
        tries = 1 if req.op == "call" else 2
        for attempt in range(1, tries + 1):
            sock = self._connect()
            try:
                sock.sendall(encode(req))
                return self._reply(sock)
            except (OSError, ValueError) as e:
                self.close()
                if attempt == tries or isinstance(e, TimeoutError):
                    raise ControllerGone(
                        f"{self.path}: the controller did not answer ({e})"
                    ) from None
        raise AssertionError("unreachable")

    def _reply(self, sock: socket.socket) -> Reply:
        while b"\n" not in self._buf:
            if len(self._buf) > MAX_LINE:
                raise ValueError("reply too long")
            chunk = sock.recv(65536)
            if not chunk:
                raise ConnectionResetError("closed")
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return decode_reply(line)

    def hello(self) -> dict[str, Any]:
        return self.ask(Request("hello")).data

    def status(self) -> dict[str, Any]:
        return self.ask(Request("status")).data

    def stop(self) -> dict[str, Any]:
        return self.ask(Request("stop")).data

    def call(self, method: str, *args: Any) -> None:
        reply = self.ask(Request("call", method, list(args)))
        if reply.refused:
            raise Refused(reply.refused)
        if not reply.ok:
            raise ValueError(reply.error)

    def __getattr__(self, name: str) -> Any:
        """``remote.stop_job("demo")`` as on the controller, for its actions only."""
        if name not in CALLS:
            raise AttributeError(name)
        return lambda *args: self.call(name, *args)


__all__ = ["CALL_S", "ControllerGone", "Remote"]
