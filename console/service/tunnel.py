"""A view on another machine: the controller's control socket and state files, over SSH.

``hotspare --attach ops@ctl1:/srv/hotspare/.hotspare`` opens one verified SSH connection to
the controller's machine (host keys checked as for every host, ``console/reach/transport``).
Over it:

- the controller's control socket (``STATE_DIR/control.sock``) is forwarded to a socket in a
  private local folder (0700), so the view's ``Remote`` speaks to it as to a local one;
- the controller's ``state.json`` and ``journal.jsonl`` are mirrored into that folder about
  once a second (SFTP), so the view's read-only controller follows them as it follows a
  local state dir.

The view never writes to the controller's machine but through the control socket. A link
that drops is dialled again (the view says since when it is lost); training never waits on
it. Textual-free; the connection lives in a thread of its own, as ``Remote`` is blocking.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from urllib.parse import urlsplit

import asyncssh

from console.reach.transport.base import TransportError
from console.reach.transport.ssh_dial import Dialer, SshTarget, SshTuning, one_line
from console.service.wire import SOCKET_NAME
from protocol.errors import ConfigError, HotspareError

MIRROR_S = 1.0
"""How often the state files are read again (the view asks the controller as often)."""
OP_S = 10.0
"""The longest one SSH operation (a forward, an SFTP stat or read) may take."""
REDIAL_S = 2.0
"""The pause before a lost link is dialled again."""
JOURNAL_TAIL = 8 << 20
"""At most this much of the journal's end is copied at first (a console reads its tail too)."""
FILES = ("state.json", "journal.jsonl")

_SCP_FORM = re.compile(r"^(?:(?P<user>[^@/:\s]+)@)?(?P<host>[^@/:\s\[\]]+):(?P<path>/.*)$")


class TunnelError(HotspareError, RuntimeError):
    """The controller's machine could not be reached, or would not forward; one line."""

    permanent = False


@dataclass(frozen=True)
class ControllerAt:
    """Where a controller runs: its machine over SSH and its state dir there."""

    host: str
    state_dir: str
    """Absolute, on the controller's machine."""
    user: str | None = None
    port: int | None = None

    @classmethod
    def parse(cls, text: str) -> ControllerAt:
        """``[USER@]HOST:/STATE_DIR`` or ``ssh://[USER@]HOST[:PORT]/STATE_DIR``."""
        usage = "give [USER@]HOST:/STATE_DIR or ssh://[USER@]HOST[:PORT]/STATE_DIR"
        if text.startswith("ssh://"):
            try:
                url = urlsplit(text)
                port = url.port
            except ValueError as e:
                raise ConfigError(f"--attach {text!r}: {e}; {usage}") from None
            if not url.hostname or not url.path.startswith("/") or url.query or url.fragment:
                raise ConfigError(f"--attach {text!r}: not a controller's address; {usage}")
            return cls(url.hostname, _clean(text, url.path), url.username or None, port)
        m = _SCP_FORM.match(text)
        if m is None:
            raise ConfigError(f"--attach {text!r}: not a controller's address; {usage}")
        return cls(m["host"], _clean(text, m["path"]), m["user"])

    def __str__(self) -> str:
        who = f"{self.user}@" if self.user else ""
        port = f":{self.port}" if self.port else ""
        return f"{who}{self.host}{port}:{self.state_dir}"


def _bytes(data: bytes | str) -> bytes:
    """SFTP reads of a file opened ``rb`` are bytes (asyncssh types them either way)."""
    return data if isinstance(data, bytes) else data.encode()


def _clean(text: str, path: str) -> str:
    clean = str(PurePosixPath(path))
    if ".." in PurePosixPath(clean).parts or "\0" in clean:
        raise ConfigError(f"--attach {text!r}: the state dir must be a plain absolute path")
    return clean


class ControllerTunnel:
    """The control socket forwarded, and the state files mirrored, under ``local``."""

    def __init__(self, at: ControllerAt, target: SshTarget) -> None:
        self.at = at
        self.target = target
        self.local = Path(tempfile.mkdtemp(prefix="hsv-", dir="/tmp"))
        """Holds ``control.sock`` (a Unix socket path must stay under 108 bytes)."""
        self.state_dir = self.local / "state"
        """The mirror: what the view's read-only controller reads."""
        self.state_dir.mkdir()
        self.lost_since: float | None = None
        """Wall time the link was lost; None while it is up."""
        self.why_lost = ""
        self.mirrored_at: float | None = None
        """Wall time of the newest complete mirror."""
        self._journal_at: int | None = None
        self._state_seen: tuple[int, int] | None = None
        self._ready = threading.Event()
        self._error: str | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="controller tunnel", daemon=True)

    def open(self, timeout: float) -> None:
        """Connect, forward and mirror once; ``TunnelError`` (one line) if that fails."""
        self._thread.start()
        if not self._ready.wait(timeout):
            self.close()
            raise TunnelError(f"{self.at.host}: not connected in {timeout:g} s")
        if self._error is not None:
            self.close()
            raise TunnelError(self._error)

    def close(self) -> None:
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None:
            with contextlib.suppress(RuntimeError):  # the loop already ended
                loop.call_soon_threadsafe(stop.set)
        if self._thread.is_alive():
            self._thread.join(timeout=OP_S)
        shutil.rmtree(self.local, ignore_errors=True)

    def line(self) -> str:
        """The title's words for the link."""
        if self.lost_since is not None:
            since = time.strftime("%H:%M:%S", time.localtime(self.lost_since))
            return f"SSH link to {self.at.host} LOST since {since} ({self.why_lost})"
        return f"over ssh from {self.at.host}"

    # ------------------------------------------------------------ the thread

    def _run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = stop = asyncio.Event()
        while not stop.is_set():
            try:
                conn = await Dialer(self.target, SshTuning()).dial()
                try:
                    await self._serve(conn)
                finally:
                    conn.close()
                    with contextlib.suppress(Exception):
                        async with asyncio.timeout(OP_S):
                            await conn.wait_closed()
            except (TransportError, asyncssh.Error, OSError, TimeoutError) as e:
                why = one_line(str(e) or type(e).__name__)
                if not self._ready.is_set():  # never connected: the view is told, and ends
                    self._error = why if isinstance(e, TransportError) else f"{self.at}: {why}"
                    self._ready.set()
                    return
                self.why_lost = why
            if self.lost_since is None:
                self.lost_since = time.time()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(REDIAL_S):
                    await stop.wait()

    async def _serve(self, conn: asyncssh.SSHClientConnection) -> None:
        """Forward the socket and mirror the files until the link drops or the view closes."""
        assert self._stop is not None
        sock = self.local / SOCKET_NAME
        sock.unlink(missing_ok=True)
        async with asyncio.timeout(OP_S):
            listener = await conn.forward_local_path(
                str(sock), str(PurePosixPath(self.at.state_dir, SOCKET_NAME))
            )
        try:
            async with asyncio.timeout(OP_S):
                sftp = await conn.start_sftp_client()
            try:
                await self._mirror(sftp)
                self.lost_since = None
                self._ready.set()
                while not self._stop.is_set():
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(MIRROR_S):
                            await self._stop.wait()
                    if not self._stop.is_set():
                        await self._mirror(sftp)
            finally:
                sftp.exit()
        finally:
            listener.close()
            sock.unlink(missing_ok=True)

    async def _mirror(self, sftp: asyncssh.SFTPClient) -> None:
        await self._copy_state(sftp)
        await self._append_journal(sftp)
        self.mirrored_at = time.time()

    async def _copy_state(self, sftp: asyncssh.SFTPClient) -> None:
        """``state.json`` copied whole when its size or mtime changed, replaced atomically."""
        path = str(PurePosixPath(self.at.state_dir, "state.json"))
        async with asyncio.timeout(OP_S):
            try:
                attrs = await sftp.stat(path)
            except asyncssh.SFTPNoSuchFile:
                return  # a controller that has saved nothing yet
            seen = (int(attrs.size or 0), int(attrs.mtime_ns or attrs.mtime or 0))
            if seen == self._state_seen:
                return
            async with sftp.open(path, "rb") as f:
                data = _bytes(await f.read())
        tmp = self.state_dir / ".state.json.tmp"
        tmp.write_bytes(data)
        os.replace(tmp, self.state_dir / "state.json")
        self._state_seen = seen

    async def _append_journal(self, sftp: asyncssh.SFTPClient) -> None:
        """What the journal grew by, complete lines only; a journal made anew is read again."""
        path = str(PurePosixPath(self.at.state_dir, "journal.jsonl"))
        local = self.state_dir / "journal.jsonl"
        async with asyncio.timeout(OP_S):
            try:
                size = int((await sftp.stat(path)).size or 0)
            except asyncssh.SFTPNoSuchFile:
                return
            at = self._journal_at
            if at is None or size < at:
                at = max(0, size - JOURNAL_TAIL)
                local.write_bytes(b"")
            if size == at:
                self._journal_at = at
                return
            async with sftp.open(path, "rb") as f:
                data = _bytes(await f.read(size - at, at))
        if at > 0 and self._journal_at is None:
            data = data[data.find(b"\n") + 1 :]  # the tail starts on a whole line
            at = size - len(data)
        end = data.rfind(b"\n") + 1
        with open(local, "ab") as out:
            out.write(data[:end])
        self._journal_at = at + end


__all__ = ["ControllerAt", "ControllerTunnel", "TunnelError"]
