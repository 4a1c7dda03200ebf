"""A failover target reads and verifies the newest checkpoint before Start; the load after
Start takes those bytes, and only while the file is the one verified.

Evidence: the bytes this process read from files (/proc/self/io ``rchar``), the tensors
loaded, and the load's refusal of a file changed after it was read ahead.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from support.checkpointbed import Events, manager, save_steps

from executors.checkpoints import verified
from executors.checkpoints.checkpoint import checkpoint_name
from executors.fencing.publish import read_ahead

SIZE = 2_000_000  # floats: an 8 MB checkpoint
CAP = 1 << 30


def rchar() -> int:
    """Bytes this process has read (any file, page cache or not)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


@pytest.fixture(autouse=True)
def nothing_kept() -> None:
    verified.drop()


def test_a_checkpoint_read_ahead_is_loaded_without_reading_it_again(tmp_path: Path) -> None:
    save_steps(manager(tmp_path, Events()), 10, 20, size=SIZE)
    assert read_ahead(tmp_path, CAP) == 20
    before = rchar()
    loaded = manager(tmp_path, Events()).load_latest()
    read = rchar() - before
    assert loaded is not None and loaded.manifest.step == 20
    assert torch.equal(loaded.state["model"]["w"], torch.full((SIZE,), 20.0))
    assert read < SIZE, f"read {read} bytes: the checkpoint was read again"
    before = rchar()
    again = manager(tmp_path, Events()).load_latest()  # taken once: the next load reads
    assert again is not None and again.manifest.step == 20
    assert rchar() - before >= SIZE * 4


def test_a_file_changed_after_it_was_read_ahead_is_read_and_refused(tmp_path: Path) -> None:
    save_steps(manager(tmp_path, Events()), 10, 20, size=SIZE)
    assert read_ahead(tmp_path, CAP) == 20
    data = tmp_path / f"{checkpoint_name(20)}.pt"
    raw = bytearray(data.read_bytes())
    raw[-100] ^= 0xFF  # same size, one byte flipped, written in place
    with open(data, "r+b") as f:
        f.write(raw)
    events = Events()
    loaded = manager(tmp_path, events).load_latest()
    assert loaded is not None and loaded.manifest.step == 10, "the damaged newest is skipped"
    assert any("sha256" in f.message for f in events.faults()), events.faults()


def test_a_file_renamed_over_the_one_read_ahead_is_read_and_refused(tmp_path: Path) -> None:
    save_steps(manager(tmp_path, Events()), 10, 20, size=SIZE)
    assert read_ahead(tmp_path, CAP) == 20
    data = tmp_path / f"{checkpoint_name(20)}.pt"
    other = tmp_path / ".other"
    other.write_bytes(bytes(data.stat().st_size))
    os.replace(other, data)
    events = Events()
    loaded = manager(tmp_path, events).load_latest()
    assert loaded is not None and loaded.manifest.step == 10
    assert any("sha256" in f.message for f in events.faults()), events.faults()


def test_a_checkpoint_over_the_memory_share_or_damaged_is_not_read_ahead(tmp_path: Path) -> None:
    assert read_ahead(tmp_path, CAP) is None, "an empty folder"
    save_steps(manager(tmp_path, Events()), 10, size=SIZE)
    assert read_ahead(tmp_path, SIZE) is None, "over the cap"
    before = rchar()
    assert manager(tmp_path, Events()).load_latest() is not None
    assert rchar() - before >= SIZE * 4, "nothing was kept: the load read the file"
    data = tmp_path / f"{checkpoint_name(10)}.pt"
    data.write_bytes(data.read_bytes()[:-10])
    assert read_ahead(tmp_path, CAP) is None, "a truncated checkpoint is not kept"
