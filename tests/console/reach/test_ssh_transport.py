"""The ssh transport against real sshd hosts on loopback: keys, addresses, quoting, streams."""

from __future__ import annotations

import asyncio
import hashlib
import os
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncssh
import psutil
import pytest
from support.sshbed import SshBed, SshHost
from support.wait import until

from console.reach.transport import ssh as ssh_module
from console.reach.transport.base import PermanentTransportError, TemporaryTransportError
from console.reach.transport.ssh import SshTarget, SshTransport

MB = 1 << 20
HOSTILE = [
    "$(touch {marker})",
    "`touch {marker}`",
    "; touch {marker}; echo",
    "a' ; touch {marker} ; '",
    'a" ; touch {marker} ; "',
    "line one\nline two; touch {marker}",
    "  spaces  and\ttabs  ",
    "| touch {marker} &",
    "*",
    "-n",
    "back\\slash $HOME ${HOME} ~",
    "",
]
ECHO_SERVER = """
import os, socket, sys
s = socket.socket(socket.AF_UNIX)
s.bind(sys.argv[1] + ".tmp")
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
s.listen()
while True:
    c, _ = s.accept()
    while data := c.recv(65536):
        c.sendall(data)
    c.close()
"""


def target(host: SshHost, **overrides: Any) -> SshTarget:
    values: dict[str, Any] = {
        "name": host.name,
        "addresses": [host.address],
        "port": host.port,
        "user": "root",
        "identity": str(host.bed.client_key),
        "known_hosts": str(host.bed.known_hosts),
        "connect_timeout": 5.0,
        "keepalive_s": 5.0,
        "command_timeout": 20.0,
    }
    values.update(overrides)
    return SshTarget(**values)


async def file_chunks(path: Path, offset: int = 0, stop: int | None = None) -> AsyncIterator[bytes]:
    with open(path, "rb") as f:
        f.seek(offset)
        left = (stop if stop is not None else path.stat().st_size) - offset
        while left > 0 and (block := f.read(min(MB, left))):
            left -= len(block)
            yield block


def random_file(path: Path, size: int) -> str:
    digest = hashlib.sha256()
    with open(path, "wb") as f:
        for _ in range(size // MB):
            block = os.urandom(MB)
            digest.update(block)
            f.write(block)
    return digest.hexdigest()


@pytest.fixture
def host(ssh_hosts: Callable[[int], list[SshHost]]) -> SshHost:
    return ssh_hosts(1)[0]


async def test_connects_with_the_right_key_and_reuses_the_connection(host: SshHost) -> None:
    async with SshTransport(target(host)) as t:
        first = await t.run(["sh", "-c", "echo $SSH_CONNECTION"])
        results = await asyncio.gather(*(t.run(["echo", str(i)]) for i in range(12)))
    assert first.returncode == 0
    assert first.stdout.split()[2:] == [host.address, str(host.port)]
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(12)]
    assert t.connects == 1


async def test_unknown_host_key_is_refused_with_how_to_trust_it(
    host: SshHost, tmp_path: Path
) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    t = SshTransport(target(host, known_hosts=str(empty)))
    with pytest.raises(PermanentTransportError) as err:
        await t.connect()
    message = str(err.value)
    assert message.startswith(f"{host.name}:") and "\n" not in message
    assert "unknown" in message
    assert f"ssh-keyscan -p {host.port} {host.address} >> {empty}" in message
    assert "SHA256:" in message


async def test_changed_host_key_is_refused_as_changed(host: SshHost, tmp_path: Path) -> None:
    other = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode().strip()
    known = tmp_path / "known_hosts"
    known.write_text(f"[{host.address}]:{host.port} {other}\n")
    t = SshTransport(target(host, known_hosts=str(known)))
    with pytest.raises(PermanentTransportError) as err:
        await t.connect()
    message = str(err.value)
    assert "CHANGED" in message and "unknown" not in message
    assert f"ssh-keygen -R '[{host.address}]:{host.port}'" in message


async def test_auth_failure_is_clear_quick_and_not_retried(
    host: SshHost, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stranger = tmp_path / "stranger"
    asyncssh.generate_private_key("ssh-ed25519").write_private_key(str(stranger))
    dials = 0
    real_connect = asyncssh.connect

    async def counting_connect(*args: Any, **kwargs: Any) -> asyncssh.SSHClientConnection:
        nonlocal dials
        dials += 1
        return await real_connect(*args, **kwargs)

    monkeypatch.setattr(ssh_module.asyncssh, "connect", counting_connect)
    t = SshTransport(target(host, identity=str(stranger)))
    started = time.monotonic()
    with pytest.raises(PermanentTransportError) as err:
        await t.connect()
    assert time.monotonic() - started < 3
    assert dials == 1
    assert str(err.value) == (
        f"{host.name}: authentication refused for root@{host.address}:{host.port} with {stranger}"
    )


async def test_missing_identity_file_is_permanent(host: SshHost, tmp_path: Path) -> None:
    with pytest.raises(PermanentTransportError, match=r"identity file .* does not exist"):
        await SshTransport(target(host, identity=str(tmp_path / "nope"))).connect()


async def test_dead_first_address_falls_through_to_the_second(host: SshHost) -> None:
    async with SshTransport(target(host, addresses=["127.0.0.250", host.address])) as t:
        result = await t.run(["sh", "-c", "echo $SSH_CONNECTION"])
    assert result.stdout.split()[2] == host.address


async def test_unreachable_host_is_temporary_after_bounded_retries(host: SshHost) -> None:
    host.kill_all()
    t = SshTransport(target(host, addresses=[host.address, "127.0.0.250"]))
    started = time.monotonic()
    with pytest.raises(TemporaryTransportError) as err:
        await t.connect()
    assert time.monotonic() - started < 5
    assert str(err.value).startswith(f"{host.name}: unreachable:")
    assert host.address in str(err.value) and "127.0.0.250" in str(err.value)


async def test_hostile_arguments_reach_the_command_literally(host: SshHost, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    values = [v.replace("{marker}", str(marker)) for v in HOSTILE]
    async with SshTransport(target(host)) as t:
        for value in values:
            echoed = await t.run(["printf", "%s", value])
            assert echoed.stdout == value
            via_env = await t.run(["sh", "-c", 'printf %s "$V"'], env={"V": value})
            assert via_env.stdout == value
        folder = str(host.root / values[0] / values[2])
        await t.makedirs(folder)
        assert (await t.stat(folder)) is not None
        await t.remove(folder)
        assert await t.stat(folder) is None
        with pytest.raises(PermanentTransportError, match="environment variable"):
            await t.run(["true"], env={"A;touch x": "1"})
    assert not marker.exists()


async def test_run_reports_exit_status_stderr_and_input(host: SshHost) -> None:
    async with SshTransport(target(host)) as t:
        failed = await t.run(["sh", "-c", "echo oops >&2; exit 7"])
        fed = await t.run(["cat"], input=b"fed through stdin")
        no_input = await t.run(["cat"])
    assert (failed.returncode, failed.stderr) == (7, "oops\n")
    assert fed.stdout == "fed through stdin"
    assert no_input.stdout == ""


async def test_run_timeout_is_temporary_and_the_command_does_not_linger(host: SshHost) -> None:
    async with SshTransport(target(host)) as t:
        with pytest.raises(TemporaryTransportError, match=f"^{host.name}: run sleep: timed out"):
            await t.run(["sleep", "31.5"], timeout=0.3)
        assert (await t.run(["true"])).returncode == 0

    async def killed() -> bool:
        return not [p for p in psutil.process_iter() if _cmdline(p) == ["sleep", "31.5"]]

    await until(killed, 6, "the timed-out command to be killed on the host", interval=0.02)


def _cmdline(p: psutil.Process) -> list[str]:
    try:
        return [] if p.status() == psutil.STATUS_ZOMBIE else p.cmdline()
    except psutil.Error:
        return []


async def test_detached_process_outlives_the_connection(host: SshHost) -> None:
    log = host.root / "sleeper.log"
    async with SshTransport(target(host)) as t:
        pid = await t.start_detached(
            ["sh", "-c", 'echo "started in $(pwd) with $MARK"; exec sleep 300'],
            log_path=str(log),
            env={"MARK": "x y"},
            cwd=str(host.root),
        )
    sshd = psutil.Process(host.proc.pid if host.proc else 0)
    await until(lambda: _no_sessions(sshd), 5, "the ssh session to end", interval=0.02)
    async with SshTransport(target(host)) as t:
        assert (await t.run(["kill", "-0", str(pid)])).returncode == 0
        assert (await t.run(["cat", str(log)])).stdout == f"started in {host.root} with x y\n"
        assert psutil.Process(pid).cmdline() == ["sleep", "300"]
        await t.run(["kill", str(pid)])
    await until(_exited(pid), 5, "the detached process to exit", interval=0.02)


def _exited(pid: int) -> Callable[[], Awaitable[bool]]:
    """Gone or a zombie: the bed's hosts share this machine's process table (and its init)."""

    async def check() -> bool:
        try:
            return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    return check


async def _no_sessions(sshd: psutil.Process) -> bool:
    return not sshd.children()


async def test_open_socket_round_trips_bytes(host: SshHost) -> None:
    sock = str(host.root / "echo.sock")
    async with SshTransport(target(host)) as t:
        with pytest.raises(TemporaryTransportError, match=f"^{host.name}: connect to {sock}"):
            await t.open_socket(sock)
        await t.start_detached(
            [sys.executable, "-c", ECHO_SERVER, sock], log_path=sock + ".log", cwd=str(host.root)
        )

        async def served() -> bool:
            return await t.stat(sock) is not None

        await until(served, 10, "the echo server's socket", interval=0.02)
        reader, writer = await t.open_socket(sock)
        payload = os.urandom(300_000)
        writer.write(payload)
        await writer.drain()
        assert await reader.readexactly(len(payload)) == payload
        writer.close()


async def test_put_get_and_verify_50_mb(host: SshHost, tmp_path: Path) -> None:
    local = tmp_path / "blob"
    digest = random_file(local, 50 * MB)
    remote = str(host.root / "blob")
    async with SshTransport(target(host)) as t:
        assert await t.write_chunks(remote, file_chunks(local)) == 50 * MB
        assert await t.sha256(remote) == digest
        st = await t.stat(remote)
        assert st is not None and (st.size, st.is_dir) == (50 * MB, False)
        assert abs(st.mtime - os.stat(remote).st_mtime) < 1e-6
        back = hashlib.sha256()
        async for block in t.read_chunks(remote):
            back.update(block)
        tail = hashlib.sha256()
        async for block in t.read_chunks(remote, offset=30 * MB):
            tail.update(block)
    assert back.hexdigest() == digest
    with open(local, "rb") as f:
        f.seek(30 * MB)
        assert tail.hexdigest() == hashlib.sha256(f.read()).hexdigest()


async def test_transfer_broken_midway_resumes(host: SshHost, tmp_path: Path) -> None:
    local = tmp_path / "blob"
    digest = random_file(local, 24 * MB)
    remote = str(host.root / "blob.part")
    t = SshTransport(target(host))

    async def drop_after(n: int) -> AsyncIterator[bytes]:
        async for block in file_chunks(local):
            yield block
            n -= len(block)
            if n <= 0:
                assert t._conn is not None
                t._conn.abort()
                await asyncio.sleep(0)

    with pytest.raises(TemporaryTransportError):
        await t.write_chunks(remote, drop_after(10 * MB))
    have = await t.stat(remote)
    assert have is not None and 0 < have.size < 24 * MB
    await t.write_chunks(remote, file_chunks(local, offset=have.size), offset=have.size)
    assert await t.sha256(remote) == digest
    assert t.connects == 2
    await t.close()


async def test_missing_files_are_permanent_or_none(host: SshHost) -> None:
    missing = str(host.root / "nothing here")
    async with SshTransport(target(host)) as t:
        assert await t.stat(missing) is None
        await t.remove(missing)
        with pytest.raises(PermanentTransportError, match=f"^{host.name}: sha256 {missing}: "):
            await t.sha256(missing)
        with pytest.raises(PermanentTransportError, match=f"^{host.name}: read {missing}: "):
            async for _ in t.read_chunks(missing):
                pass
        with pytest.raises(PermanentTransportError, match=f"^{host.name}: write "):
            await t.write_chunks(missing + "/deeper", file_chunks(Path(__file__)))
        assert (await t.stat(str(host.root))).is_dir  # type: ignore[union-attr]


async def test_lost_connection_is_redialled_on_next_use(host: SshHost) -> None:
    async with SshTransport(target(host)) as t:
        await t.run(["true"])
        host.kill_all()
        host.start()
        assert t._conn is not None
        await until(_closed(t), 5, "the client to notice the dead connection", interval=0.02)
        assert (await t.run(["echo", "back"])).stdout == "back\n"
        assert t.connects == 2


def _closed(t: SshTransport) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return t._conn is None or t._conn.is_closed()

    return check


async def test_proxy_jump_goes_through_the_jump_host(ssh_bed: SshBed) -> None:
    jump, inner = ssh_bed.host(), ssh_bed.host()
    via = f"root@{jump.address}:{jump.port}"
    async with SshTransport(target(inner, proxy_jump=via)) as t:
        assert (await t.run(["echo", "inside"])).stdout == "inside\n"
    jump.kill_all()
    with pytest.raises(TemporaryTransportError, match="jump host"):
        await SshTransport(target(inner, proxy_jump=via)).connect()
