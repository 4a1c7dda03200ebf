"""The ``ssh`` transport: one verified asyncssh connection per host, every channel over it.

Host keys are always checked (the target's known_hosts, else ``~/.ssh/known_hosts``);
``~/.ssh/config`` applies unless the target says otherwise. Commands are argv lists joined
with ``shlex``; small file operations are coreutils commands with their paths passed as
positional parameters of ``sh -c``, never spliced into a script. Bulk data rides a raw
exec channel (``cat``/``tail`` out, ``dd`` in) rather than SFTP: see ``SshTuning``.
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import logging
import os
import re
import shlex
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import asyncssh
from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential,
)

from console.transport.base import (
    CHUNK,
    FileStat,
    PermanentTransportError,
    RunResult,
    StreamReaderLike,
    StreamWriterLike,
    TemporaryTransportError,
    Transport,
    TransportError,
)
from console.transport.detach import detach_argv

log = logging.getLogger(__name__)

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_PERMANENT_DISCONNECTS = (
    asyncssh.KeyExchangeFailed,
    asyncssh.ProtocolNotSupported,
    asyncssh.IllegalUserName,
)


@dataclass(frozen=True)
class SshTarget:
    """Where and how to reach one host; plain values so the inventory stays out of here."""

    name: str
    addresses: list[str]
    """Tried in order on every attempt: a second path to the same host."""
    port: int | None = None
    """None: ``~/.ssh/config`` or 22."""
    user: str | None = None
    identity: str | None = None
    """A private key file; None: the agent and the default keys."""
    known_hosts: str | None = None
    """None: ``~/.ssh/known_hosts``. Never disables checking."""
    proxy_jump: str | None = None
    """``[user@]host[:port]``, reached with this target's keys and known_hosts."""
    connect_timeout: float = 10.0
    keepalive_s: float = 15.0
    command_timeout: float = 30.0


@dataclass(frozen=True)
class SshTuning:
    """Knobs for bulk transfer; the defaults won ``benchmarks/transfer_vs_scp.py``.

    AES-GCM is one OpenSSL call per packet where asyncssh's chacha20-poly1305 is three, and
    larger inbound packets and window mean fewer trips through asyncssh's per-packet Python.
    """

    ciphers: tuple[str, ...] = (
        "aes128-gcm@openssh.com",
        "aes256-gcm@openssh.com",
        "chacha20-poly1305@openssh.com",
        "aes128-ctr",
        "aes192-ctr",
        "aes256-ctr",
    )
    window: int = 8 << 20
    max_pktsize: int = 128 << 10
    connect_attempts: int = 3
    max_sessions: int = 8
    """Exec channels at once; OpenSSH's default MaxSessions is 10."""
    disk_mb_per_s: float = 50.0
    """Floor on the destination's fsync speed, to size the write timeout."""
    extra: dict[str, object] = field(default_factory=dict)
    """More ``asyncssh.connect`` keywords (benchmarks)."""


def _one_line(text: str, limit: int = 240) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


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
        self._conn: asyncssh.SSHClientConnection | None = None
        self._jump: asyncssh.SSHClientConnection | None = None
        self._lock = asyncio.Lock()
        self._sessions = asyncio.Semaphore(self.tuning.max_sessions)
        self.connects = 0
        """Successful dials, for tests and the UI."""

    # -- connection ---------------------------------------------------------------------------

    async def connect(self) -> None:
        await self._connection()

    async def close(self) -> None:
        async with self._lock:
            for conn in (self._conn, self._jump):
                if conn is not None:
                    conn.close()
                    with contextlib.suppress(Exception):
                        async with asyncio.timeout(self.target.connect_timeout):
                            await conn.wait_closed()
            self._conn = self._jump = None

    async def _connection(self) -> asyncssh.SSHClientConnection:
        async with self._lock:
            if self._conn is None or self._conn.is_closed():
                if self._jump is not None:
                    self._jump.close()
                self._conn = self._jump = None
                self._conn = await self._dial()
                self.connects += 1
            return self._conn

    async def _dial(self) -> asyncssh.SSHClientConnection:
        """Every address in order, a few times with backoff; permanent errors end it at once."""
        self._check_files()
        retrying = AsyncRetrying(
            retry=retry_if_exception_type(TemporaryTransportError),
            stop=stop_after_attempt(self.tuning.connect_attempts)
            | stop_after_delay(self.target.connect_timeout * 2),
            wait=wait_exponential(multiplier=0.2, max=2.0),
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                return await self._dial_each()
        raise AssertionError("unreachable")  # pragma: no cover

    def _check_files(self) -> None:
        for what, path in (
            ("identity", self.target.identity),
            ("known_hosts", self.target.known_hosts),
        ):
            if path is not None and not os.path.isfile(path):
                raise PermanentTransportError(f"{self.name}: {what} file {path} does not exist")

    async def _dial_each(self) -> asyncssh.SSHClientConnection:
        failures: list[str] = []
        for address in self.target.addresses:
            try:
                return await self._dial_one(address)
            except TemporaryTransportError as e:
                failures.append(str(e).removeprefix(f"{self.name}: "))
        raise TemporaryTransportError(f"{self.name}: unreachable: {'; '.join(failures)}")

    def _options(self) -> dict[str, object]:
        t = self.target
        opts: dict[str, object] = {
            "connect_timeout": t.connect_timeout,
            "keepalive_interval": t.keepalive_s,
            "keepalive_count_max": 3,
            "encryption_algs": list(self.tuning.ciphers),
            **self.tuning.extra,
        }
        if t.port is not None:
            opts["port"] = t.port
        if t.user is not None:
            opts["username"] = t.user
        if t.identity is not None:
            opts["client_keys"] = [t.identity]
        if t.known_hosts is not None:
            opts["known_hosts"] = t.known_hosts
        return opts

    async def _dial_one(self, address: str) -> asyncssh.SSHClientConnection:
        opts = self._options()
        if self.target.proxy_jump:
            opts["tunnel"] = await self._jump_host()
        port = self.target.port or 22
        log.debug("%s: connecting to %s:%s", self.name, address, port)
        try:
            async with asyncio.timeout(self.target.connect_timeout + 1):
                return await asyncssh.connect(address, **opts)
        except asyncssh.HostKeyNotVerifiable:
            raise await self._host_key_refused(self.name, address, port) from None
        except (asyncssh.Error, OSError, TimeoutError, ValueError) as e:
            raise self._dial_error(e, address, port) from None

    async def _jump_host(self) -> asyncssh.SSHClientConnection | str:
        """The jump host, dialled with this target's keys and known_hosts (a chain: asyncssh's)."""
        spec = self.target.proxy_jump or ""
        if "," in spec:
            return spec
        if self._jump is not None and not self._jump.is_closed():
            return self._jump
        user, _, hostport = spec.rpartition("@")
        host, _, port_text = hostport.partition(":")
        port = int(port_text) if port_text.isdigit() else 22
        opts = self._options()
        opts["port"] = port
        if user:
            opts["username"] = user
        try:
            async with asyncio.timeout(self.target.connect_timeout + 1):
                self._jump = await asyncssh.connect(host, **opts)
        except asyncssh.HostKeyNotVerifiable:
            raise await self._host_key_refused(f"{self.name} (jump {host})", host, port) from None
        except (asyncssh.Error, OSError, TimeoutError, ValueError) as e:
            raise self._dial_error(e, f"jump host {host}", port) from None
        return self._jump

    async def _host_key_refused(self, label: str, address: str, port: int) -> TransportError:
        """Unknown or changed (whether known_hosts lists the host decides), and how to trust it."""
        path = self.target.known_hosts or os.path.expanduser("~/.ssh/known_hosts")
        host = address if port == 22 else f"[{address}]:{port}"
        try:
            trusted, cas, *_ = asyncssh.match_known_hosts(path, address, address, port)
            known = bool(trusted or cas)
        except (OSError, ValueError):
            known = False
        seen = ""
        with contextlib.suppress(Exception):
            async with asyncio.timeout(self.target.connect_timeout):
                key = await asyncssh.get_server_host_key(
                    address, port, tunnel=self._jump or (), config=None
                )
            if key is not None:
                seen = f", it presents {key.get_fingerprint()}"
        file, keyscan = shlex.quote(path), f"ssh-keyscan -p {port} {address} >> {shlex.quote(path)}"
        if known:
            return PermanentTransportError(
                f"{label}: host key for {host} has CHANGED from the one in {path}{seen} (possible"
                f" man-in-the-middle); if the host was reinstalled, check the fingerprint, then:"
                f" ssh-keygen -R {shlex.quote(host)} -f {file} && {keyscan}"
            )
        return PermanentTransportError(
            f"{label}: host key for {host} is unknown (not in {path}{seen}); check the"
            f" fingerprint, then trust it: {keyscan}"
        )

    def _dial_error(self, e: Exception, address: str, port: int) -> TransportError:
        user = self.target.user or getpass.getuser()
        where = f"{user}@{address}:{port}"
        if isinstance(e, asyncssh.PermissionDenied):
            keys = self.target.identity or "the agent and default keys"
            return PermanentTransportError(
                f"{self.name}: authentication refused for {where} with {keys}"
            )
        if isinstance(e, asyncssh.KeyImportError | asyncssh.KeyEncryptionError):
            return PermanentTransportError(
                f"{self.name}: cannot use identity {self.target.identity}: {_one_line(str(e))}"
            )
        if isinstance(e, (*_PERMANENT_DISCONNECTS, ValueError)):
            return PermanentTransportError(f"{self.name}: {where}: {_one_line(str(e))}")
        if isinstance(e, TimeoutError):
            return TemporaryTransportError(
                f"{self.name}: {where}: timed out after {self.target.connect_timeout:g}s"
            )
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e) or type(e).__name__
        return TemporaryTransportError(f"{self.name}: {where}: {_one_line(reason)}")

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
                    f"{self.name}: {what}: refused by sshd: {_one_line(e.reason)}"
                ) from None
            raise TemporaryTransportError(f"{self.name}: {what}: {_one_line(e.reason)}") from None
        except (asyncssh.Error, OSError, EOFError) as e:
            reason = getattr(e, "reason", "") or str(e) or type(e).__name__
            raise TemporaryTransportError(f"{self.name}: {what}: {_one_line(reason)}") from None

    async def _process(
        self, command: str, what: str, timeout: float
    ) -> asyncssh.SSHClientProcess[bytes]:
        conn = await self._connection()
        with self._errors(what, timeout):
            async with asyncio.timeout(timeout):
                return await conn.create_process(
                    command,
                    encoding=None,
                    window=self.tuning.window,
                    max_pktsize=self.tuning.max_pktsize,
                )

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
        limit = self._t(timeout)
        what = f"run {argv[0]}"
        async with self._sessions:
            proc = await self._process(_command(self.name, argv, env), what, limit)
            try:
                with self._errors(what, limit):
                    async with asyncio.timeout(limit):
                        if input:
                            proc.stdin.write(input)
                        proc.stdin.write_eof()
                        out, err = await proc.communicate()
            except TemporaryTransportError:
                with contextlib.suppress(Exception):
                    proc.send_signal("KILL")
                raise
            finally:
                proc.close()
        if proc.returncode is None:
            raise TemporaryTransportError(f"{self.name}: {what}: connection lost before it exited")
        return RunResult(proc.returncode, _text(out), _text(err))

    async def _check(self, command: str, what: str, timeout: float | None) -> str:
        """Run a helper command; a non-zero exit is a permanent error with its stderr."""
        limit = self._t(timeout)
        async with self._sessions:
            proc = await self._process(command, what, limit)
            try:
                with self._errors(what, limit):
                    async with asyncio.timeout(limit):
                        proc.stdin.write_eof()
                        out, err = await proc.communicate()
            finally:
                proc.close()
        if proc.returncode != 0:
            reason = _one_line(_text(err)) or f"exit status {proc.returncode}"
            raise PermanentTransportError(f"{self.name}: {what}: {reason}")
        return _text(out)

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
            reason = _one_line(result.stderr) or f"exit status {result.returncode}"
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
        try:
            out = await self._check(_sh(script, path), f"stat {path}", timeout)
        except PermanentTransportError as e:
            if str(e).endswith("exit status 3"):
                return None
            raise
        size, mtime, mode, _date, clock, *_ = out.split()
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
        out = await self._check(_sh('exec sha256sum < "$1"', path), f"sha256 {path}", timeout)
        digest = out[:64]
        if not re.fullmatch(r"[0-9a-f]{64}", digest):
            raise PermanentTransportError(
                f"{self.name}: sha256 {path}: odd output {_one_line(out)}"
            )
        return digest

    async def read_chunks(
        self, path: str, *, offset: int = 0, chunk: int = CHUNK
    ) -> AsyncIterator[bytes]:
        argv = ["tail", "-c", f"+{offset + 1}", "--", path] if offset else ["cat", "--", path]
        what = f"read {path}"
        limit = self.target.command_timeout
        async with self._sessions:
            proc = await self._process(shlex.join(argv), what, limit)
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
            'umask 077; exec dd of="$1" bs=1M seek="$2" oflag=seek_bytes iflag=fullblock'
            " conv=fsync status=none"
        )
        what = f"write {path}"
        limit = self.target.command_timeout
        written = 0
        async with self._sessions:
            proc = await self._process(_sh(script, path, str(offset)), what, limit)
            try:
                async for block in chunks:
                    with self._errors(what, limit):
                        proc.stdin.write(block)
                        async with asyncio.timeout(limit):
                            await proc.stdin.drain()
                    written += len(block)
                with self._errors(what, limit):
                    proc.stdin.write_eof()
                fsync = limit + written / (self.tuning.disk_mb_per_s * 1e6)
                with self._errors(what, fsync):
                    async with asyncio.timeout(fsync):
                        await proc.wait_closed()
                        err = await proc.stderr.read()
            finally:
                proc.close()
        _exited_well(self.name, what, proc, err)
        return written


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
        reason = _one_line(_text(err)) or f"exit status {proc.returncode}"
        raise PermanentTransportError(f"{host}: {what}: {reason}")
