"""The direct sender's streaming, called directly: a resumed copy starts at the offset the
receiver names, counted over the whole checkpoint (a folder's files one after another), and a
receiver gone mid-stream is a False, not an exception. Real files and real pipes."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from console.replication import direct_sender

PARTS = [b"alpha", b"bravo-7", b"c3!"]
WHOLE = b"".join(PARTS)


def opened(tmp_path: Path) -> list[tuple[object, int]]:
    files = []
    for i, data in enumerate(PARTS):
        (tmp_path / f"f{i}").write_bytes(data)
        files.append([str(tmp_path / f"f{i}"), len(data)])
    got = direct_sender.open_all(files)
    assert got is not None
    return got  # type: ignore[no-any-return]


@pytest.mark.parametrize("offset", [0, 1, 4, 5, 6, 11, 12, 13, len(WHOLE) - 1, len(WHOLE)])
def test_the_stream_starts_at_the_offset_of_the_whole_across_file_boundaries(
    tmp_path: Path, offset: int
) -> None:
    files = opened(tmp_path)
    out = tmp_path / "out"
    fd = os.open(out, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        assert direct_sender.stream_all(files, fd, offset) is True
    finally:
        os.close(fd)
        for f, _ in files:
            f.close()  # type: ignore[attr-defined]
    assert out.read_bytes() == WHOLE[offset:]


def test_a_receiver_gone_mid_stream_is_false_not_an_exception(tmp_path: Path) -> None:
    big = tmp_path / "big"
    big.write_bytes(os.urandom(4 << 20))  # more than a pipe holds: the write blocks, then breaks
    got = direct_sender.open_all([[str(big), 4 << 20]])
    assert got is not None
    r, w = os.pipe()
    first = threading.Event()

    def read_a_little_then_close() -> None:
        os.read(r, 1 << 16)
        first.set()
        os.close(r)

    reader = threading.Thread(target=read_a_little_then_close)
    reader.start()
    try:
        assert direct_sender.stream_all(got, w, 0) is False
    finally:
        reader.join(timeout=10)
        os.close(w)
        got[0][0].close()
    assert first.is_set()


def test_a_file_shorter_than_its_manifest_is_refused_before_a_byte_is_sent(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "short").write_bytes(b"abc")
    assert direct_sender.open_all([[str(tmp_path / "short"), 10]]) is None
    assert "shorter than its manifest says" in capfd.readouterr().out
