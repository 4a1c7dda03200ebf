"""The ``ssh`` transport: one verified asyncssh connection per host, every channel over it.

Host keys are always checked (the target's known_hosts, else ``~/.ssh/known_hosts``) and
``~/.ssh/config`` applies where the target leaves a value out; dialling is ``ssh_dial``.
Commands are argv lists joined with ``shlex``; file helpers are coreutils commands whose
paths travel as positional parameters of ``sh -c``, never spliced into a script, run in the
C locale so a failure carries its errno (ENOSPC, EDQUOT) read back from the error text. Bulk data
rides a raw exec channel (``cat``/``tail`` out, ``dd`` in), not SFTP: it measured faster
(``benchmarks/transfer_vs_scp.py``), and resuming is an offset on the command line.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import re
import shlex
from collections.abc import AsyncGenerator, AsyncIterator, Iterator, Mapping, Sequence

import asyncssh

from console.reach.transport.base import (
    CHUNK,
    FileStat,
    PermanentTransportError,
    RunResult,
    StreamReaderLike,
    StreamWriterLike,
    TemporaryTransportError,
    Transport,
    TransportError,
    errno_of,
)
from console.reach.transport.detach import detach_argv
from console.reach.transport.ssh_dial import Dialer, SshTarget, SshTuning, one_line
from console.reach.transport.tcp_stall import stalled

__all__ = ["SshTarget", "SshTransport", "SshTuning"]

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_C_LOCALE = "env LC_ALL=C"
"""File helpers run in the C locale, so their error text maps back to an errno (errno_of)."""


def _sh(script: str, *args: str) -> str:
    """A command line running ``script`` with ``args`` as $1..., each quoted."""
    return shlex.join(["sh", "-c", script, "sh", *args])


class SshTransport(Transport):
    """A host over SSH; ``connect`` is implicit, a lost connection is redialled on next use."""

    def __init__(self, target: SshTarget, tuning: SshTuning | None = None) -> None:
        if not target.addresses:
            raise ValueError(f"{target.name}: no address to reach it at")
        self.target = target
        self.tuning = tuning or SshTuning()
        self.name = target.name
        self.default_timeout = target.command_timeout
        self._dialer = Dialer(target, self.tuning)
        self._conn: asyncssh.SSHClientConnection | None = None
        self._lock = asyncio.Lock()
        self._sessions = asyncio.Semaphore(self.tuning.max_sessions)
        self.connects = 0
        """Successful dials so far: 1 while the first connection lasts."""

    async def connect(self) -> None:
        await self._connection()

    async def close(self) -> None:
        async with self._lock:
            for conn in (self._conn, self._dialer.drop_jump()):
                if conn is not None:
                    conn.close()
                    with contextlib.suppress(asyncssh.Error, OSError, TimeoutError):
                        async with asyncio.timeout(self.target.connect_timeout):
                            await conn.wait_closed()
            self._conn = None

    async def _connection(self) -> asyncssh.SSHClientConnection:
        async with self._lock:
            if self._conn is not None and stalled(self._conn.get_extra_info("socket")):
                # Kept across an outage, it would wake at its next retransmission, perhaps a
                # minute after the link is back: dial afresh, and its channels fail now.
                self._conn.abort()
                self._conn = None
            if self._conn is None or self._conn.is_closed():
                self._conn = None
                self._conn = await self._dialer.dial()
                self.connects += 1
            return self._conn

    # -- channels -----------------------------------------------------------------------------

    def _t(self, timeout: float | None) -> float:
        return self.default_timeout if timeout is None else timeout

    @contextlib.contextmanager
    def _errors(self, what: str, timeout: float) -> Iterator[None]:
        """Map what asyncssh and the OS raise to the transport's two kinds, naming the host."""
        try:
            yield
        except TransportError:
            raise
        except TimeoutError:
            raise TemporaryTransportError(
                f"{self.name}: {what}: timed out after {timeout:g}s"
            ) from None
        except asyncssh.ChannelOpenError as e:
            if e.code == asyncssh.OPEN_ADMINISTRATIVELY_PROHIBITED:
                raise PermanentTransportError(
                    f"{self.name}: {what}: refused by sshd: {one_line(e.reason)}"
                ) from None
            raise TemporaryTransportError(f"{self.name}: {what}: {one_line(e.reason)}") from None
        except (asyncssh.Error, OSError, EOFError) as e:
            reason = getattr(e, "reason", "") or str(e) or type(e).__name__
            raise TemporaryTransportError(
                f"{self.name}: {what}: {one_line(reason)}",
                errno=e.errno if isinstance(e, OSError) else None,
            ) from None

    async def _process(
        self, command: str, what: str, timeout: float
    ) -> asyncssh.SSHClientProcess[bytes]:
        conn = await self._connection()
        with self._errors(what, timeout):
            async with asyncio.timeout(timeout):
                return await conn.create_process(command, encoding=None)

    def errors(self, what: str, timeout: float) -> contextlib.AbstractContextManager[None]:
        """Map what asyncssh and the OS raise (``what`` timed out after ``timeout``) to the
        transport's two kinds, naming the host: for callers that speak over ``process``."""
        return self._errors(what, timeout)

    @contextlib.asynccontextmanager
    async def process(
        self, argv: Sequence[str], what: str, timeout: float
    ) -> AsyncIterator[asyncssh.SSHClientProcess[bytes]]:
        """A command the caller talks to over its stdin and stdout (every argument quoted),
        closed on the way out. Its caller bounds each read and write with a timeout."""
        async with self._sessions:
            proc = await self._process(shlex.join(argv), what, timeout)
            try:
                yield proc
            finally:
                proc.close()

    async def run(
        self,
        argv: Sequence[str],
        *,
        timeout: float | None = None,
        input: bytes | None = None,
        env: Mapping[str, str] | None = None,
    ) -> RunResult:
        if not argv:
            raise PermanentTransportError(f"{self.name}: run: empty command")
        command = _command(self.name, argv, env)
        return await self._exec(command, f"run {argv[0]}", self._t(timeout), input)

    async def _exec(
        self, command: str, what: str, limit: float, input: bytes | None = None
    ) -> RunResult:
        """One command to completion, under a remote ``timeout`` too: sshd cannot signal a
        root session's command, and one left running after we gave up would leak."""
        if math.isfinite(limit):
            command = f"timeout -s KILL {math.ceil(limit) + 2} {command}"
        async with self._sessions:
            proc = await self._process(command, what, limit)
            try:
                with self._errors(what, limit):
                    async with asyncio.timeout(limit):
                        if input:
                            proc.stdin.write(input)
                        proc.stdin.write_eof()
                        out, err = await proc.communicate()
            finally:
                proc.close()
        if proc.returncode is None:
            raise TemporaryTransportError(f"{self.name}: {what}: connection lost before it exited")
        return RunResult(proc.returncode, _text(out), _text(err))

    async def _check(self, command: str, what: str, timeout: float | None) -> str:
        """A helper command whose failure is a permanent error carrying its stderr and errno."""
        result = await self._exec(f"{_C_LOCALE} {command}", what, self._t(timeout))
        if result.returncode != 0:
            reason = one_line(result.stderr) or f"exit status {result.returncode}"
            raise PermanentTransportError(
                f"{self.name}: {what}: {reason}", errno=errno_of(result.stderr)
            )
        return result.stdout

    async def start_detached(
        self,
        argv: Sequence[str],
        *,
        log_path: str,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float | None = None,
    ) -> int:
        _check_env(self.name, env)
        argv_ = detach_argv(argv, log_path=log_path, env=env, cwd=cwd)
        result = await self.run(argv_, timeout=timeout)
        pid = result.stdout.strip()
        if result.returncode == 97:
            raise PermanentTransportError(f"{self.name}: start {argv[0]}: no folder {cwd}")
        if result.returncode != 0 or not pid.isdigit():
            reason = one_line(result.stderr) or f"exit status {result.returncode}"
            raise PermanentTransportError(f"{self.name}: start {argv[0]}: {reason}")
        return int(pid)

    async def open_socket(
        self, path: str, *, timeout: float | None = None
    ) -> tuple[StreamReaderLike, StreamWriterLike]:
        limit = self._t(timeout)
        conn = await self._connection()
        with self._errors(f"connect to {path}", limit):
            async with asyncio.timeout(limit):
                reader, writer = await conn.open_unix_connection(path)
        return reader, writer

    # -- files --------------------------------------------------------------------------------

    async def stat(self, path: str, *, timeout: float | None = None) -> FileStat | None:
        script = '[ -e "$1" ] || exit 3; exec stat -L -c "%s %Y %f %y" -- "$1"'
        what = f"stat {path}"
        result = await self._exec(f"{_C_LOCALE} {_sh(script, path)}", what, self._t(timeout))
        if result.returncode == 3:
            return None
        if result.returncode != 0:
            reason = one_line(result.stderr) or f"exit status {result.returncode}"
            raise PermanentTransportError(
                f"{self.name}: {what}: {reason}", errno=errno_of(result.stderr)
            )
        size, mtime, mode, _date, clock, *_ = result.stdout.split()
        fraction = clock.partition(".")[2]
        return FileStat(
            size=int(size),
            mtime=int(mtime) + (float("0." + fraction) if fraction else 0.0),
            is_dir=int(mode, 16) & 0o170000 == 0o040000,
        )

    async def remove(self, path: str, *, timeout: float | None = None) -> None:
        if path.strip("/") == "":
            raise PermanentTransportError(f"{self.name}: refusing to remove {path!r}")
        await self._check(shlex.join(["rm", "-rf", "--", path]), f"remove {path}", timeout)

    async def rename(self, src: str, dst: str, *, timeout: float | None = None) -> None:
        """Replace ``dst`` with ``src`` in one step (rename(2)), as ``os.replace`` does."""
        await self._check(shlex.join(["mv", "-f", "-T", "--", src, dst]), f"rename {src}", timeout)

    async def makedirs(self, path: str, *, timeout: float | None = None) -> None:
        await self._check(shlex.join(["mkdir", "-p", "--", path]), f"mkdir {path}", timeout)

    async def sha256(self, path: str, *, timeout: float | None = None) -> str:
        # OpenSSL's sha256 uses the CPU's SHA instructions: 3-4x coreutils' on a checkpoint.
        script = (
            'exec <"$1" || exit 1; command -v openssl >/dev/null'
            " && exec openssl dgst -sha256 -r || exec sha256sum"
        )
        out = await self._check(_sh(script, path), f"sha256 {path}", timeout)
        digest = out[:64]
        if not re.fullmatch(r"[0-9a-f]{64}", digest):
            raise PermanentTransportError(f"{self.name}: sha256 {path}: odd output {one_line(out)}")
        return digest

    async def read_chunks(
        self, path: str, *, offset: int = 0, chunk: int = CHUNK
    ) -> AsyncGenerator[bytes, None]:
        argv = ["tail", "-c", f"+{offset + 1}", "--", path] if offset else ["cat", "--", path]
        what = f"read {path}"
        limit = self.target.command_timeout
        async with self._sessions:
            proc = await self._process(f"{_C_LOCALE} {shlex.join(argv)}", what, limit)
            try:
                while True:
                    with self._errors(what, limit):
                        async with asyncio.timeout(limit):
                            block = await proc.stdout.read(chunk)
                    if not block:
                        break
                    yield block
                with self._errors(what, limit):
                    async with asyncio.timeout(limit):
                        await proc.wait_closed()
                        err = await proc.stderr.read()
            finally:
                proc.close()
        _exited_well(self.name, what, proc, err)

    async def write_chunks(
        self, path: str, chunks: AsyncIterator[bytes], *, offset: int = 0
    ) -> int:
        script = (
            'umask 077; LC_ALL=C; export LC_ALL; exec dd of="$1" bs=1M seek="$2" oflag=seek_bytes iflag=fullblock'
            " conv=fsync status=none"
        )
        what = f"write {path}"
        limit = self.target.command_timeout
        written = 0
        async with self._sessions:
            proc = await self._process(_sh(script, path, str(offset)), what, limit)
            try:
                try:
                    async for block in chunks:
                        with self._errors(what, limit):
                            proc.stdin.write(block)
                            async with asyncio.timeout(limit):
                                await proc.stdin.drain()
                        written += len(block)
                    with self._errors(what, limit):
                        proc.stdin.write_eof()
                except TemporaryTransportError:
                    await self._why_dd_stopped(proc, what)
                    raise
                fsync = limit + written / (self.tuning.disk_mb_per_s * 1e6)
                with self._errors(what, fsync):
                    async with asyncio.timeout(fsync):
                        await proc.wait_closed()
                        err = await proc.stderr.read()
            finally:
                proc.close()
        _exited_well(self.name, what, proc, err)
        return written

    async def _why_dd_stopped(self, proc: asyncssh.SSHClientProcess[bytes], what: str) -> None:
        """A write that broke because dd quit (no such folder, disk full) is permanent."""
        err = b""
        with contextlib.suppress(asyncssh.Error, OSError, TimeoutError):
            async with asyncio.timeout(1.0):
                await proc.wait_closed()
                err = await proc.stderr.read()
        if proc.returncode:
            _exited_well(self.name, what, proc, err)


def _text(data: bytes | str | None) -> str:
    if data is None:
        return ""
    return data if isinstance(data, str) else data.decode(errors="replace")


def _check_env(host: str, env: Mapping[str, str] | None) -> None:
    for key in env or {}:
        if not _ENV_NAME.fullmatch(key):
            raise PermanentTransportError(f"{host}: not an environment variable name: {key!r}")


def _command(host: str, argv: Sequence[str], env: Mapping[str, str] | None) -> str:
    """The one string sshd hands to the login shell: every argument quoted, env via ``env``."""
    _check_env(host, env)
    if env:
        return shlex.join(["env", *(f"{k}={v}" for k, v in env.items()), *argv])
    return shlex.join(argv)


def _exited_well(
    host: str, what: str, proc: asyncssh.SSHClientProcess[bytes], err: bytes | str
) -> None:
    if proc.returncode is None:
        raise TemporaryTransportError(f"{host}: {what}: connection lost before it finished")
    if proc.returncode != 0:
        reason = one_line(_text(err)) or f"exit status {proc.returncode}"
        raise PermanentTransportError(f"{host}: {what}: {reason}", errno=errno_of(_text(err)))
