"""The command kind's checkpoint folder refuses what is not a regular file, never waits on it."""

from __future__ import annotations

import os
from pathlib import Path

from executors.kinds.command.command_files import Publisher, Watcher
from protocol.messages import ExecutorMessage, Fault
from protocol.spec import CommandSpec


def publisher(folder: Path, events: list[ExecutorMessage]) -> Publisher:
    folder.mkdir(parents=True, exist_ok=True)
    return Publisher(
        folder, job="j", spec_hash="h", keep=3, epoch=1, code_version="v", emit=events.append
    )


def test_a_fifo_manifest_or_data_file_is_skipped_not_waited_on(tmp_path: Path) -> None:
    events: list[ExecutorMessage] = []
    pub = publisher(tmp_path / "ckpt", events)
    os.mkfifo(pub.folder / "step-0000000020.json")  # a reader would block forever on open
    (pub.folder / "step-0000000010.json").symlink_to("/dev/zero")  # endless bytes
    dest = tmp_path / "dest"
    dest.mkdir()
    cs = CommandSpec(argv=["true"], checkpoint_dir=str(dest))
    assert pub.restore(dest, cs) is None
    faults = [e for e in events if isinstance(e, Fault)]
    assert len(faults) == 2
    assert all(f.fault == "checkpoint_corrupt" for f in faults)
    assert "not a regular file" in faults[0].message
    assert list(dest.iterdir()) == []


def test_a_file_with_no_step_in_its_name_is_said_once_and_never_a_checkpoint(
    tmp_path: Path,
) -> None:
    """nanoGPT's ckpt.pt under the numbered-files rule: once a silent zero, now a warning that
    names the file, the rule and the key that fixes it."""
    said: list[str] = []
    (tmp_path / "ckpt.pt").write_bytes(b"x")
    (tmp_path / "ckpt-20.pt").write_bytes(b"y")
    w = Watcher(tmp_path, CommandSpec(argv=["true"], settle_s=0), warn=said.append)
    assert w.files() == [(tmp_path / "ckpt-20.pt", 20)]
    assert [c.step for c in w.complete(exited_ok=True)] == [20]
    assert len(said) == 1, said
    assert str(tmp_path / "ckpt.pt") in said[0] and "step_regex" in said[0]
    assert "checkpoint_file = 'ckpt.pt'" in said[0]


def test_a_file_rewritten_in_place_takes_the_step_printed_before_it_was_written(
    tmp_path: Path,
) -> None:
    progress: list[tuple[int, int]] = []

    def step_at(t_ns: int) -> int | None:
        steps = [s for t, s in progress if t <= t_ns]
        return max(steps) if steps else None

    cs = CommandSpec(
        argv=["true"], checkpoint_file="ckpt.pt", progress_regex=r"(?P<step>\d+)", settle_s=0
    )
    w = Watcher(tmp_path, cs, step_at=step_at)
    path = tmp_path / "ckpt.pt"
    path.write_bytes(b"restored")  # before any progress: the restored file, not a new one
    os.utime(path, ns=(1_000, 1_000))
    assert w.complete(exited_ok=True) == []
    progress += [(2_000, 39), (3_000, 40)]
    path.write_bytes(b"written at 39")
    os.utime(path, ns=(2_500, 2_500))
    (cand,) = w.complete(exited_ok=True)
    assert cand.path == path and cand.step == 39
    (tmp_path / "other-80.pt").write_bytes(b"z")  # checkpoint_glob is not used
    assert [p for p, _ in w.files()] == [path]


def test_checkpoint_file_needs_progress_and_a_plain_name() -> None:
    import pytest

    with pytest.raises(ValueError, match="needs progress_regex or metrics_file"):
        CommandSpec(argv=["true"], checkpoint_file="ckpt.pt")
    with pytest.raises(ValueError, match="a file name in checkpoint_dir"):
        CommandSpec(argv=["true"], checkpoint_file="../ckpt.pt", progress_regex="(?P<step>1)")


def test_a_file_rewritten_faster_than_it_settles_is_a_warning_not_a_silent_zero(
    tmp_path: Path,
) -> None:
    """nanoGPT's ckpt.pt rewritten every second under settle_s 2 s never settled, so nothing
    was ever published and nothing said so (found by benchmarks/byo_script.py)."""
    said: list[str] = []
    cs = CommandSpec(
        argv=["true"], checkpoint_file="ckpt.pt", progress_regex=r"(?P<step>\d+)", settle_s=60
    )
    w = Watcher(tmp_path, cs, step_at=lambda _t: 7, warn=said.append)
    path = tmp_path / "ckpt.pt"
    for i in range(6):
        path.write_bytes(b"write %d" % i)
        os.utime(path, ns=(1_000 * (i + 1), 1_000 * (i + 1)))
        assert w.complete() == [], "none settled"
    assert len(said) == 1, said
    assert str(path) in said[0] and "settle_s 60" in said[0] and "complete_marker" in said[0]


def test_a_file_that_settles_between_writes_is_no_warning(tmp_path: Path) -> None:
    said: list[str] = []
    cs = CommandSpec(
        argv=["true"], checkpoint_file="ckpt.pt", progress_regex=r"(?P<step>\d+)", settle_s=0
    )
    w = Watcher(tmp_path, cs, step_at=lambda _t: 7, warn=said.append)
    path = tmp_path / "ckpt.pt"
    for i in range(6):
        path.write_bytes(b"write %d" % i)
        os.utime(path, ns=(1_000 * (i + 1), 1_000 * (i + 1)))
        assert [c.path for c in w.complete()] == [path]
    assert said == []
