"""The controller's control socket: views and ``hotspare stop`` reach a running controller here.

A Unix socket in the state dir, mode 0600 (only the controller's user may act). Each request
is answered in turn on its connection; an operator action runs the controller's own method,
so a view's action is journalled, refused or done exactly as at an embedded console.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import msgspec

from console.service.wire import CALLS, MAX_LINE, SOCKET_NAME, Reply, decode_request, encode
from console.supervise.refusal import Refused
from protocol.errors import ConfigError

IDLE_S = 120.0
"""A connection that sends nothing for this long is closed (a view asks every second)."""
WRITE_S = 5.0


class Controlled(Protocol):
    """What the socket needs of the controller: its actions (``CALLS``) by name, its policy,
    and each job's state as it stands."""

    def status(self) -> dict[str, dict[str, Any]]: ...

    @property
    def policy(self) -> object: ...


class Standing:
    """What the socket answers for a controller that stands by (``standby.py``): who leads,
    no jobs, and every action refused, so a view says so instead of waiting."""

    def __init__(self, policy: str) -> None:
        self.policy = policy
        self.why = "standing by: campaigning"

    def status(self) -> dict[str, dict[str, Any]]:
        return {"jobs": {}, "host_jobs": {}}

    def __getattr__(self, name: str) -> Callable[..., None]:
        if name not in CALLS:
            raise AttributeError(name)

        def refuse(*_: object) -> None:
            raise Refused(f"this controller is {self.why}; act on the leader")

        return refuse


class ControlServer:
    def __init__(self, state_dir: Path, ctl: Controlled, *, stop: Callable[[], object]) -> None:
        self.path = state_dir / SOCKET_NAME
        self._ctl = ctl
        self._stop = stop
        """Ends the controller (``hotspare stop``): closes it as a clean quit would."""
        self._since = time.time()
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        """Listen; a socket file left by a controller that died is replaced (the caller holds
        the state dir's lock, so no live controller owns it)."""
        self.path.unlink(missing_ok=True)
        old = os.umask(0o177)
        try:
            self._server = await asyncio.start_unix_server(
                self._serve, path=str(self.path), limit=MAX_LINE
            )
        finally:
            os.umask(old)
        os.chmod(self.path, 0o600)

    async def close(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(WRITE_S):
                await server.wait_closed()
        self.path.unlink(missing_ok=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                async with asyncio.timeout(IDLE_S):
                    line = await reader.readline()
                if not line:
                    return
                reply = self._answer(line)
                writer.write(encode(reply))
                async with asyncio.timeout(WRITE_S):
                    await writer.drain()
        except (TimeoutError, ConnectionError, ValueError):
            return  # a view gone or silent; a line over MAX_LINE (ValueError): dropped
        finally:
            writer.close()

    def _answer(self, line: bytes) -> Reply:
        try:
            req = decode_request(line)
        except msgspec.DecodeError as e:
            return Reply(False, error=f"not a request: {e}")
        match req.op:
            case "hello":
                return Reply(True, data=self.hello())
            case "status":
                return Reply(True, data={**self._ctl.status(), "t": time.time()})
            case "stop":
                self._stop()
                return Reply(True, data={"pid": os.getpid()})
            case "call":
                return self._call(req.method, req.args)
        return Reply(False, error=f"unknown op {req.op!r}")

    def serve(self, ctl: Controlled) -> None:
        """Answer for ``ctl`` from now on (a standby elected: its controller)."""
        self._ctl = ctl

    def hello(self) -> dict[str, Any]:
        hello = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "since": self._since,
            "policy": str(self._ctl.policy),
        }
        if isinstance(self._ctl, Standing):
            hello["standby"] = self._ctl.why
        return hello

    def _call(self, method: str, args: list[Any]) -> Reply:
        if method not in CALLS:
            return Reply(False, error=f"{method!r} is not an operator action")
        try:
            getattr(self._ctl, method)(*args)
        except Refused as e:
            return Reply(False, refused=str(e))
        except KeyError as e:
            return Reply(False, error=f"no job or host named {e}")
        except (PermissionError, ValueError, TypeError, ConfigError) as e:
            return Reply(False, error=str(e) or type(e).__name__)
        return Reply(True)


__all__ = ["IDLE_S", "ControlServer", "Standing"]
