"""The executor's socket appears only once it accepts: a client that sees ``executor.sock`` (or
``twin.sock``) is never refused. A fresh-clone run connected between bind and listen and got
``ConnectionRefusedError``."""

from __future__ import annotations

import socket
import stat
from pathlib import Path

import pytest

from executors.agent.twin import listen
from protocol.errors import ConfigError
from protocol.workdirs import MAX_SOCKET_PATH, too_long


def test_the_socket_path_is_never_there_before_it_listens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "executor.sock"
    seen_before_listen: list[bool] = []
    real_listen = socket.socket.listen

    def watching(self: socket.socket, *args: int) -> None:
        seen_before_listen.append(path.exists())
        real_listen(self, *args)

    monkeypatch.setattr(socket.socket, "listen", watching)
    sock = listen(path)
    try:
        assert seen_before_listen == [False], "the path existed before the socket listened"
        assert stat.S_ISSOCK(path.stat().st_mode)
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert [p.name for p in tmp_path.iterdir()] == ["executor.sock"], "nothing staged left"
        client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        client.settimeout(5)
        client.connect(str(path))  # refused if the rename lost the listening socket
        client.close()
    finally:
        sock.close()


def test_a_stale_file_at_either_name_is_replaced(tmp_path: Path) -> None:
    path = tmp_path / "twin.sock"
    path.write_text("stale")
    (tmp_path / ".twin.sock").write_text("stale too")
    sock = listen(path)
    try:
        assert stat.S_ISSOCK(path.stat().st_mode)
        assert not (tmp_path / ".twin.sock").exists()
    finally:
        sock.close()


def test_a_path_too_long_for_a_socket_is_one_clear_error(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * (120 - len(str(tmp_path))))
    with pytest.raises(ConfigError, match="more than a Unix socket"):
        listen(deep / "executor.sock")


def test_a_socket_path_of_107_bytes_binds_and_108_is_refused(tmp_path: Path) -> None:
    """The limit the console checks inventories against (``protocol.workdirs``) is the
    kernel's own: its hidden staged path at 107 bytes binds; at 108 it is refused first."""
    for size, binds in ((MAX_SOCKET_PATH, True), (MAX_SOCKET_PATH + 1, False)):
        pad = size - len(str(tmp_path)) - len("//.executor.sock")
        folder = tmp_path / ("x" * pad if binds else "y" * pad)
        folder.mkdir()
        path = folder / "executor.sock"
        assert len(bytes(path.with_name(".executor.sock"))) == size
        assert (too_long(str(folder)) is None) is binds
        if binds:
            listen(path).close()
            assert stat.S_ISSOCK(path.stat().st_mode)
        else:
            with pytest.raises(ConfigError, match=f"{size} bytes"):
                listen(path)
