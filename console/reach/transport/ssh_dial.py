"""Dialling one SSH host: its addresses in order, bounded retries, host keys always verified.

Split from ``ssh.py`` so the transport reads as operations. Every failure becomes one line
that names the host: temporary (refused, timed out, dropped: retried with backoff, then
raised) or permanent (authentication refused, host key unknown or changed, bad key file:
raised at once, never retried, with what to do about it).
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import logging
import os
import shlex
from dataclasses import dataclass, field

import asyncssh
from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential,
)

from console.reach.transport.base import (
    PermanentTransportError,
    TemporaryTransportError,
    TransportError,
)

log = logging.getLogger(__name__)

_PERMANENT = (
    asyncssh.KeyExchangeFailed,
    asyncssh.ProtocolNotSupported,
    asyncssh.IllegalUserName,
    ValueError,
)
_DIAL_ERRORS = (asyncssh.Error, OSError, TimeoutError, ValueError)


@dataclass(frozen=True)
class SshTarget:
    """Where and how to reach one host; plain values so the inventory stays out of here."""

    name: str
    addresses: list[str]
    """Tried in order on every attempt: a second network path to the same host."""
    port: int | None = None
    """None: ``~/.ssh/config`` or 22."""
    user: str | None = None
    identity: str | None = None
    """A private key file; None: the agent and the default keys."""
    known_hosts: str | None = None
    """None: ``~/.ssh/known_hosts``. Host keys are checked either way."""
    proxy_jump: str | None = None
    """``[user@]host[:port]``, dialled with this target's keys and known_hosts."""
    connect_timeout: float = 10.0
    keepalive_s: float = 15.0
    command_timeout: float = 30.0


@dataclass(frozen=True)
class SshTuning:
    """Knobs measured by ``benchmarks/transfer_vs_scp.py``; the defaults won there.

    AES-GCM first: one OpenSSL call per packet, where asyncssh's chacha20-poly1305 takes
    three (about 1.4x the throughput on loopback). Larger channel windows and packets made
    no difference, so asyncssh's own are kept.
    """

    ciphers: tuple[str, ...] = (
        "aes128-gcm@openssh.com",
        "aes256-gcm@openssh.com",
        "chacha20-poly1305@openssh.com",
        "aes128-ctr",
        "aes192-ctr",
        "aes256-ctr",
    )
    connect_attempts: int = 3
    max_sessions: int = 8
    """Exec channels open at once; OpenSSH's default MaxSessions is 10."""
    disk_mb_per_s: float = 50.0
    """Slowest disk we expect to fsync to, which sizes the timeout of a large write."""
    extra: dict[str, object] = field(default_factory=dict)
    """More ``asyncssh.connect`` keywords, for experiments."""


def one_line(text: str, limit: int = 240) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


class Dialer:
    """Opens connections for one target, and keeps the jump host's connection alongside."""

    def __init__(self, target: SshTarget, tuning: SshTuning) -> None:
        self.target = target
        self.tuning = tuning
        self.name = target.name
        self.jump: asyncssh.SSHClientConnection | None = None

    async def dial(self) -> asyncssh.SSHClientConnection:
        """Every address in order, a few rounds with backoff; a permanent error ends it at once."""
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
                return await self._each_address()
        raise AssertionError("unreachable")  # pragma: no cover

    def drop_jump(self) -> asyncssh.SSHClientConnection | None:
        jump, self.jump = self.jump, None
        return jump

    def _check_files(self) -> None:
        for what, path in (
            ("identity", self.target.identity),
            ("known_hosts", self.target.known_hosts),
        ):
            if path is not None and not os.path.isfile(path):
                raise PermanentTransportError(f"{self.name}: {what} file {path} does not exist")

    async def _each_address(self) -> asyncssh.SSHClientConnection:
        failures: list[str] = []
        for address in self.target.addresses:
            try:
                return await self._one(address, self.target.port or 22, self.target.user)
            except TemporaryTransportError as e:
                failures.append(str(e).removeprefix(f"{self.name}: "))
        raise TemporaryTransportError(f"{self.name}: unreachable: {'; '.join(failures)}")

    def _options(self, port: int, user: str | None) -> dict[str, object]:
        t = self.target
        opts: dict[str, object] = {
            "connect_timeout": t.connect_timeout,
            "keepalive_interval": t.keepalive_s,
            "keepalive_count_max": 3,
            "encryption_algs": list(self.tuning.ciphers),
            **self.tuning.extra,
        }
        if t.port is not None or port != 22:
            opts["port"] = port
        if user is not None:
            opts["username"] = user
        if t.identity is not None:
            opts["client_keys"] = [t.identity]
        if t.known_hosts is not None:
            opts["known_hosts"] = t.known_hosts
        return opts

    async def _one(
        self, address: str, port: int, user: str | None, label: str = ""
    ) -> asyncssh.SSHClientConnection:
        opts = self._options(port, user)
        if self.target.proxy_jump and not label:
            opts["tunnel"] = await self._jump_host()
        log.debug("%s: connecting to %s:%s", self.name, address, port)
        try:
            async with asyncio.timeout(self.target.connect_timeout + 1):
                return await asyncssh.connect(address, **opts)
        except asyncssh.HostKeyNotVerifiable:
            raise await self._host_key_refused(label, address, port) from None
        except _DIAL_ERRORS as e:
            raise self._error(e, f"{label}{user or getpass.getuser()}@{address}:{port}") from None

    async def _jump_host(self) -> asyncssh.SSHClientConnection | str:
        """The jump host, with this target's keys and known_hosts (a chain goes to asyncssh)."""
        spec = self.target.proxy_jump or ""
        if "," in spec:
            return spec
        if self.jump is None or self.jump.is_closed():
            user, _, hostport = spec.rpartition("@")
            host, _, port = hostport.partition(":")
            self.jump = await self._one(
                host, int(port) if port.isdigit() else 22, user or None, label="jump host "
            )
        return self.jump

    async def _host_key_refused(self, label: str, address: str, port: int) -> TransportError:
        """Unknown or changed (whether known_hosts lists the host decides), and how to trust it."""
        path = self.target.known_hosts or os.path.expanduser("~/.ssh/known_hosts")
        host = address if port == 22 else f"[{address}]:{port}"
        try:
            trusted, cas, *_ = asyncssh.match_known_hosts(path, address, address, port)
            known = bool(trusted or cas)
        except (OSError, ValueError):
            known = False
        seen = await self._fingerprint(address, port, via_jump=not label)
        file = shlex.quote(path)
        keyscan = f"ssh-keyscan -p {port} {address} >> {file}"
        if known:
            return PermanentTransportError(
                f"{self.name}: {label}host key for {host} has CHANGED from the one in {path}{seen}"
                " (possible man-in-the-middle); if the host was reinstalled, check the"
                f" fingerprint, then: ssh-keygen -R {shlex.quote(host)} -f {file} && {keyscan}"
            )
        return PermanentTransportError(
            f"{self.name}: {label}host key for {host} is unknown (not in {path}{seen}); check the"
            f" fingerprint, then trust it: {keyscan}"
        )

    async def _fingerprint(self, address: str, port: int, via_jump: bool) -> str:
        """What the host presents, so the operator can compare it out of band."""
        tunnel = self.jump if via_jump and self.jump is not None else ()
        with contextlib.suppress(*_DIAL_ERRORS):
            async with asyncio.timeout(self.target.connect_timeout):
                key = await asyncssh.get_server_host_key(address, port, tunnel=tunnel)
            if key is not None:
                return f", it presents {key.get_fingerprint()}"
        return ""

    def _error(self, e: BaseException, where: str) -> TransportError:
        if isinstance(e, asyncssh.PermissionDenied):
            keys = self.target.identity or "the agent and default keys"
            return PermanentTransportError(
                f"{self.name}: authentication refused for {where} with {keys}"
            )
        if isinstance(e, asyncssh.KeyImportError | asyncssh.KeyEncryptionError):
            return PermanentTransportError(
                f"{self.name}: cannot use identity {self.target.identity}: {one_line(str(e))}"
            )
        if isinstance(e, _PERMANENT):
            return PermanentTransportError(f"{self.name}: {where}: {one_line(str(e))}")
        if isinstance(e, TimeoutError):
            return TemporaryTransportError(
                f"{self.name}: {where}: timed out after {self.target.connect_timeout:g}s"
            )
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        return TemporaryTransportError(
            f"{self.name}: {where}: {one_line(reason or type(e).__name__)}"
        )
