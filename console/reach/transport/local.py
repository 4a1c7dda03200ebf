"""The ``local`` transport: a host that is a folder on this machine, run by subprocesses.

The embedded default and the demo. Paths are plain paths on this machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import shutil
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from pathlib import Path

from console.reach.transport import local_host
from console.reach.transport.base import (
    CHUNK,
    DiskUsage,
    FileStat,
    PermanentTransportError,
    RunResult,
    StreamReaderLike,
    StreamWriterLike,
    TemporaryTransportError,
    Transport,
)
from console.reach.transport.detach import detach_argv

KILLED_MARK = ".hotspare-killed"


class LocalTransport(Transport):
    def __init__(self, name: str, *, default_timeout: float = 30.0, root: str = "") -> None:
        self.name = name
        self.root = root
        """The host's folder (its "disk"): with the name, what names its cgroup."""
        self.default_timeout = default_timeout
        self._cut = False
        """Unreachable from this console only (``set_down``: a test's cut link)."""
        self._streams: list[asyncio.StreamWriter] = []

    @property
    def _killed_mark(self) -> Path | None:
        """A demo host "killed" from a console: a file in its folder, so every console and
        view on this machine sees it killed (and a console started again still does)."""
        return Path(self.root) / KILLED_MARK if self.root else None

    @property
    def down(self) -> bool:
        """Every call fails as if the host were gone: killed, or cut off from this console."""
        mark = self._killed_mark
        return self._cut or (mark is not None and mark.exists())

    @property
    def killed(self) -> bool:
        mark = self._killed_mark
        return mark is not None and mark.exists()

    def set_down(self, down: bool) -> None:
        """Cut (or heal) this console's reach to the host; the host itself runs on."""
        self._cut = down
        if down:
            self._drop_streams()

    def _drop_streams(self) -> None:
        for w in self._streams:
            w.close()
        self._streams.clear()

    def kill_host(self, roots: set[int]) -> set[int]:
        """End everything this host runs, as a power cut would: its cgroup whole, and every
        descendant of ``roots`` (its executors' recorded pids); then it is down. The pids."""
        cg = local_host.host_cgroup(self.name, self.root) if self.root else None
        mark = self._killed_mark
        if mark is not None:  # first: nothing is started there once the kill has begun
            mark.parent.mkdir(parents=True, exist_ok=True)
            mark.write_text("killed from a hotspare console\n")
        else:
            self._cut = True
        ended = local_host.kill(cg, roots)
        self._drop_streams()
        return ended

    def revive(self) -> None:
        """A killed demo host is back (empty of processes, its files kept)."""
        mark = self._killed_mark
        if mark is not None:
            mark.unlink(missing_ok=True)
        self._cut = False

    def _guard(self) -> None:
        if self.down:
            raise TemporaryTransportError(f"{self.name}: host is down (killed from the console)")

    async def connect(self) -> None:
        self._guard()
        return None

    async def close(self) -> None:
        return None

    def _t(self, timeout: float | None) -> float:
        return self.default_timeout if timeout is None else timeout

    async def run(
        self,
        argv: Sequence[str],
        *,
        timeout: float | None = None,
        input: bytes | None = None,
        env: Mapping[str, str] | None = None,
    ) -> RunResult:
        self._guard()
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE if input is not None else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env={**os.environ, **env} if env else None,
            )
        except OSError as e:
            raise PermanentTransportError(
                f"{self.name}: cannot run {argv[0]}: {e.strerror}",
                errno=e.errno,
            ) from None
        try:
            async with asyncio.timeout(self._t(timeout)):
                out, err = await proc.communicate(input)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            raise TemporaryTransportError(
                f"{self.name}: {argv[0]} timed out after {self._t(timeout):g}s"
            ) from None
        except asyncio.CancelledError:  # the caller gave up: the command goes with it
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            raise
        assert proc.returncode is not None
        return RunResult(
            proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")
        )

    async def start_detached(
        self,
        argv: Sequence[str],
        *,
        log_path: str,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float | None = None,
    ) -> int:
        self._guard()
        cg = local_host.host_cgroup(self.name, self.root) if self.root else None
        result = await self.run(
            local_host.joined(cg, detach_argv(argv, log_path=log_path, env=env, cwd=cwd)),
            timeout=timeout,
        )
        if result.returncode != 0 or not result.stdout.strip().isdigit():
            raise PermanentTransportError(
                f"{self.name}: could not start {argv[0]}: {result.stderr.strip()}"
            )
        return int(result.stdout.strip())

    async def open_socket(
        self, path: str, *, timeout: float | None = None
    ) -> tuple[StreamReaderLike, StreamWriterLike]:
        self._guard()
        try:
            async with asyncio.timeout(self._t(timeout)):
                reader, writer = await asyncio.open_unix_connection(path)
                self._streams = [w for w in self._streams if not w.is_closing()] + [writer]
                return reader, writer
        except TimeoutError:
            raise TemporaryTransportError(f"{self.name}: connecting to {path} timed out") from None
        except OSError as e:
            raise TemporaryTransportError(
                f"{self.name}: cannot connect to {path}: {e.strerror}",
                errno=e.errno,
            ) from None

    async def stat(self, path: str, *, timeout: float | None = None) -> FileStat | None:
        self._guard()
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return None
        except OSError as e:
            raise PermanentTransportError(
                f"{self.name}: stat {path}: {e.strerror}", errno=e.errno
            ) from None
        return FileStat(size=st.st_size, mtime=st.st_mtime, is_dir=os.path.isdir(path))

    async def remove(self, path: str, *, timeout: float | None = None) -> None:
        self._guard()
        p = Path(path)
        if p.is_dir() and not p.is_symlink():
            await asyncio.to_thread(shutil.rmtree, p, True)
            return
        try:
            p.unlink(missing_ok=True)
        except OSError as e:
            raise PermanentTransportError(
                f"{self.name}: remove {path}: {e.strerror}", errno=e.errno
            ) from None

    async def listdir(self, path: str, *, timeout: float | None = None) -> list[str]:
        self._guard()
        try:
            return sorted(os.listdir(path))
        except FileNotFoundError:
            return []
        except OSError as e:
            raise PermanentTransportError(
                f"{self.name}: list {path}: {e.strerror}", errno=e.errno
            ) from None

    async def disk_usage(self, path: str, *, timeout: float | None = None) -> DiskUsage:
        self._guard()
        try:
            st = os.statvfs(path)
        except OSError as e:
            raise PermanentTransportError(
                f"{self.name}: statvfs {path}: {e.strerror}", errno=e.errno
            ) from None
        return DiskUsage(
            free=st.f_bavail * st.f_frsize, total=st.f_blocks * st.f_frsize, block=st.f_frsize
        )

    async def rename(self, src: str, dst: str, *, timeout: float | None = None) -> None:
        self._guard()
        try:
            os.replace(src, dst)
        except OSError as e:
            raise PermanentTransportError(
                f"{self.name}: rename {src} -> {dst}: {e.strerror}",
                errno=e.errno,
            ) from None

    async def makedirs(self, path: str, *, timeout: float | None = None) -> None:
        self._guard()
        try:
            os.makedirs(path, exist_ok=True)
        except OSError as e:
            raise PermanentTransportError(
                f"{self.name}: mkdir {path}: {e.strerror}", errno=e.errno
            ) from None

    async def sha256(self, path: str, *, timeout: float | None = None) -> str:
        self._guard()

        def digest() -> str:
            h = hashlib.sha256()
            with open(path, "rb") as f:
                while block := f.read(CHUNK * 4):
                    h.update(block)
            return h.hexdigest()

        try:
            return await asyncio.to_thread(digest)
        except OSError as e:
            raise PermanentTransportError(
                f"{self.name}: sha256 {path}: {e.strerror}", errno=e.errno
            ) from None

    async def read_chunks(
        self, path: str, *, offset: int = 0, chunk: int = CHUNK
    ) -> AsyncGenerator[bytes, None]:
        self._guard()
        try:
            f = open(path, "rb")  # noqa: SIM115 - closed in finally across awaits
        except OSError as e:
            raise PermanentTransportError(
                f"{self.name}: read {path}: {e.strerror}", errno=e.errno
            ) from None
        try:
            f.seek(offset)
            while block := await asyncio.to_thread(f.read, chunk):
                yield block
        finally:
            f.close()

    async def write_chunks(
        self, path: str, chunks: AsyncIterator[bytes], *, offset: int = 0
    ) -> int:
        self._guard()
        written = 0
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
        except OSError as e:
            raise PermanentTransportError(
                f"{self.name}: write {path}: {e.strerror}", errno=e.errno
            ) from None
        try:
            os.ftruncate(fd, offset)
            os.lseek(fd, offset, os.SEEK_SET)
            async for block in chunks:
                await asyncio.to_thread(_write_all, fd, block)
                written += len(block)
            await asyncio.to_thread(os.fsync, fd)
        except OSError as e:
            raise PermanentTransportError(
                f"{self.name}: write {path}: {e.strerror}", errno=e.errno
            ) from None
        finally:
            os.close(fd)
        return written


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
