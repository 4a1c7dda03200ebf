"""The transport interface: everything the console does on a host goes through one of these.

Every method takes a timeout (or uses the transport's default) and raises only
``TransportError`` subclasses: ``TemporaryTransportError`` (retry later: refused, timed out,
connection lost) or ``PermanentTransportError`` (do not retry: auth refused, unknown host
key, missing file). Paths are host paths (strings); commands are argv lists, never shell
strings: a transport that needs a shell quotes every argument with ``shlex``.
"""

from __future__ import annotations

import asyncio
import errno as errno_
import os
from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from protocol.errors import HotspareError

Progress = Callable[[int, int], None]
"""Called with (bytes done, bytes total) as a transfer goes."""

CHUNK = 1 << 20


class TransportError(HotspareError):
    """Something failed on the way to or on a host; ``str()`` is one line naming the host."""

    permanent = False

    def __init__(self, message: str, *, errno: int | None = None) -> None:
        super().__init__(message)
        self.errno = errno
        """The OS error number behind it, when the host's OS gave one (ENOSPC, ENOENT...):
        callers decide on this, never on the words of the message."""

    @property
    def disk_full(self) -> bool:
        """The host's disk (or the user's quota on it) has no room for what was written."""
        return self.errno in (errno_.ENOSPC, errno_.EDQUOT)


class TemporaryTransportError(TransportError):
    """Worth retrying with backoff: refused, timed out, connection dropped."""


class PermanentTransportError(TransportError):
    """Retrying will not help: authentication refused, host key not trusted, bad path."""

    permanent = True


@dataclass(frozen=True)
class RunResult:
    returncode: int
    stdout: str
    stderr: str


@dataclass(frozen=True)
class FileStat:
    size: int
    mtime: float
    is_dir: bool


@dataclass(frozen=True)
class DiskUsage:
    """The filesystem holding a path, as statvfs(3) sees it."""

    free: int
    """Bytes an unprivileged writer may still use (f_bavail x f_frsize)."""
    total: int
    block: int
    """Allocation unit: a file takes whole blocks, however small."""


_STRERROR = {os.strerror(n): n for n in sorted(errno_.errorcode, reverse=True)} | {
    "No space left on device": errno_.ENOSPC,  # glibc's and musl's names of the two that
    "Disk quota exceeded": errno_.EDQUOT,  # matter most, whatever this machine's C library
    "Quota exceeded": errno_.EDQUOT,  # (a Linux host seen from a macOS console)
}


def errno_of(stderr: str) -> int | None:
    """The errno a coreutils command died of, read back from its last line.

    GNU tools end an OS error with ``: strerror(errno)``; run under ``LC_ALL=C`` that text is
    the C library's fixed name of the number, and this maps it back (None when it is not one).
    """
    lines = stderr.strip().splitlines()
    if not lines:
        return None
    return _STRERROR.get(lines[-1].rpartition(": ")[2].strip())


class StreamReaderLike(Protocol):
    async def read(self, n: int = -1) -> bytes: ...
    async def readexactly(self, n: int) -> bytes: ...


class StreamWriterLike(Protocol):
    def write(self, data: bytes) -> None: ...
    async def drain(self) -> None: ...
    def write_eof(self) -> None: ...
    def close(self) -> None: ...


class Transport(ABC):
    """One host. ``connect`` once; every channel reuses the connection."""

    name: str
    """The host's inventory name, for messages."""
    default_timeout: float = 30.0

    @abstractmethod
    async def connect(self) -> None:
        """Open (or check) the connection; idempotent."""

    @abstractmethod
    async def close(self) -> None: ...

    @abstractmethod
    async def run(
        self,
        argv: Sequence[str],
        *,
        timeout: float | None = None,
        input: bytes | None = None,
        env: Mapping[str, str] | None = None,
    ) -> RunResult:
        """Run a command to completion; its exit status is in the result (not an error)."""

    @abstractmethod
    async def start_detached(
        self,
        argv: Sequence[str],
        *,
        log_path: str,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float | None = None,
    ) -> int:
        """Start a process in its own session that outlives this connection; returns its pid."""

    @abstractmethod
    async def open_socket(
        self, path: str, *, timeout: float | None = None
    ) -> tuple[StreamReaderLike, StreamWriterLike]:
        """A byte stream to a Unix socket on the host (ssh: a streamlocal channel)."""

    @abstractmethod
    async def stat(self, path: str, *, timeout: float | None = None) -> FileStat | None:
        """None when there is nothing at ``path``."""

    @abstractmethod
    async def remove(self, path: str, *, timeout: float | None = None) -> None:
        """Remove a file (or a folder, recursively); nothing there is not an error."""

    @abstractmethod
    async def makedirs(self, path: str, *, timeout: float | None = None) -> None: ...

    async def rename(self, src: str, dst: str, *, timeout: float | None = None) -> None:
        """Atomically replace ``dst`` with ``src`` (same filesystem)."""
        result = await self.run(["mv", "-f", "-T", "--", src, dst], timeout=timeout)
        if result.returncode != 0:
            raise PermanentTransportError(
                f"{self.name}: rename {src} -> {dst}: {result.stderr.strip()}",
                errno=errno_of(result.stderr),
            )

    async def listdir(self, path: str, *, timeout: float | None = None) -> list[str]:
        """The names in a folder (none when there is no folder)."""
        script = '[ -d "$1" ] || exit 0; exec find "$1" -mindepth 1 -maxdepth 1 -printf "%f\\0"'
        result = await self.run(
            ["env", "LC_ALL=C", "sh", "-c", script, "sh", path], timeout=timeout
        )
        if result.returncode != 0:
            raise PermanentTransportError(
                f"{self.name}: list {path}: {result.stderr.strip()}",
                errno=errno_of(result.stderr),
            )
        return sorted(name for name in result.stdout.split("\0") if name)

    async def disk_usage(self, path: str, *, timeout: float | None = None) -> DiskUsage:
        """Free and total bytes of the filesystem holding ``path``: one cheap statvfs."""
        result = await self.run(
            ["env", "LC_ALL=C", "stat", "-f", "-L", "-c", "%a %b %S", "--", path],
            timeout=timeout,
        )
        fields = result.stdout.split()
        if result.returncode != 0 or len(fields) != 3 or not all(f.isdigit() for f in fields):
            reason = result.stderr.strip() or f"odd output {result.stdout.strip()!r}"
            raise PermanentTransportError(
                f"{self.name}: statvfs {path}: {reason}", errno=errno_of(result.stderr)
            )
        avail, blocks, size = map(int, fields)
        return DiskUsage(free=avail * size, total=blocks * size, block=size)

    @abstractmethod
    async def sha256(self, path: str, *, timeout: float | None = None) -> str:
        """Hex sha256 of a file, computed on the host."""

    @abstractmethod
    def read_chunks(
        self, path: str, *, offset: int = 0, chunk: int = CHUNK
    ) -> AsyncGenerator[bytes, None]:
        """Stream a file from ``offset`` in chunks; never the whole file in memory."""

    @abstractmethod
    async def write_chunks(
        self, path: str, chunks: AsyncIterator[bytes], *, offset: int = 0
    ) -> int:
        """Write a stream to ``path`` starting at ``offset`` (truncating there), fsync; bytes written."""

    async def put(self, local: str, remote: str, *, progress: Progress | None = None) -> None:
        """Copy a local file to the host, streamed."""
        from console.reach.transport.files import put_file

        await put_file(self, local, remote, progress=progress)

    async def get(self, remote: str, local: str, *, progress: Progress | None = None) -> None:
        """Copy a file from the host to this machine, streamed."""
        from console.reach.transport.files import get_file

        await get_file(self, remote, local, progress=progress)

    async def __aenter__(self) -> Transport:
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def with_timeout(coro: object, timeout: float, what: str, host: str) -> object:
    """Await ``coro`` with a deadline; a timeout becomes a TemporaryTransportError naming the host."""
    try:
        async with asyncio.timeout(timeout):
            return await coro  # type: ignore[misc]
    except TimeoutError:
        raise TemporaryTransportError(f"{host}: {what} timed out after {timeout:g}s") from None
