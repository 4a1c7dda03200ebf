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
    with pytest.raises(ConfigError, match="socket path longer than"):
        listen(deep / "executor.sock")
