"""The command kind's checkpoint folder refuses what is not a regular file, never waits on it."""

from __future__ import annotations

import os
from pathlib import Path

from executors.command_files import Publisher
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
