"""CheckpointManager on real files: verified loads, skips of damaged checkpoints, retention, a full disk."""

from __future__ import annotations

import os
import pickle
import shutil
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
import torch
from support.checkpointbed import Events, manager, save_steps, state
from support.helpers import tmpfs

from executors.checkpoints.checkpoint import checkpoint_name
from protocol.messages import CheckpointSaved
from protocol.spec import CheckpointManifest


def test_save_is_async_verified_and_loads_back(tmp_path: Path) -> None:
    events = Events()
    m = manager(tmp_path, events)
    save_steps(m, 10, 20)
    saved = [e for e in events if isinstance(e, CheckpointSaved)]
    assert [s.manifest.step for s in saved] == [10, 20]
    manifest = msgspec.json.decode(
        (tmp_path / f"{checkpoint_name(20)}.json").read_bytes(), type=CheckpointManifest
    )
    data = (tmp_path / manifest.file).read_bytes()
    assert manifest.size == len(data)
    import hashlib

    assert manifest.sha256 == hashlib.sha256(data).hexdigest(), (
        "hashed while writing == hash of the file"
    )
    loaded = manager(tmp_path, Events()).load_latest()
    assert loaded is not None
    assert loaded.manifest.step == 20
    assert torch.equal(loaded.state["model"]["w"], torch.full((1000,), 20.0))


def test_snapshot_is_taken_at_save_time(tmp_path: Path) -> None:
    m = manager(tmp_path, Events())
    live = state(5)
    m.save(5, live)
    live["model"]["w"].fill_(-1.0)  # training goes on while the write is in flight
    m.wait()
    loaded = m.load_latest()
    assert loaded is not None
    assert torch.equal(loaded.state["model"]["w"], torch.full((1000,), 5.0))


def _damage_newest(folder: Path, how: str) -> None:
    newest = sorted(folder.glob("step-*.pt"))[-1]
    data = bytearray(newest.read_bytes())
    if how == "truncated":
        newest.write_bytes(data[: len(data) // 2])
    elif how == "bitflip":
        data[len(data) // 2] ^= 0x01
        newest.write_bytes(data)
    elif how == "manifest":
        newest.with_suffix(".json").write_text('{"job": "j", "step": ')
    elif how == "missing":
        newest.unlink()


@pytest.mark.parametrize("how", ["truncated", "bitflip", "manifest", "missing"])
def test_a_damaged_newest_checkpoint_is_skipped_for_the_previous(tmp_path: Path, how: str) -> None:
    save_steps(manager(tmp_path, Events()), 10, 20, 30)
    _damage_newest(tmp_path, how)
    events = Events()
    loaded = manager(tmp_path, events).load_latest()
    assert loaded is not None
    assert loaded.manifest.step == 20
    (fault,) = events.faults()
    assert fault.fault == "checkpoint_corrupt"
    assert checkpoint_name(30) in fault.message
    expect = {
        "truncated": "truncated",
        "bitflip": "sha256",
        "manifest": "manifest",
        "missing": "No such file",
    }[how]
    assert expect in fault.message


def test_every_checkpoint_damaged_means_a_fresh_start(tmp_path: Path) -> None:
    save_steps(manager(tmp_path, Events()), 10)
    _damage_newest(tmp_path, "bitflip")
    events = Events()
    assert manager(tmp_path, events).load_latest() is None
    assert len(events.faults()) == 1


def test_a_pickle_that_runs_code_is_never_executed(tmp_path: Path) -> None:
    """A file with a valid manifest (sha256 and all) still loads only with weights_only=True."""
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self) -> tuple:
            return (os.system, (f"touch {marker}",))

    save_steps(manager(tmp_path, Events()), 10)
    evil = tmp_path / f"{checkpoint_name(20)}.pt"
    with open(evil, "wb") as f:
        torch.save({"model": Evil()}, f, pickle_module=pickle)
    import hashlib

    blob = evil.read_bytes()
    manifest = CheckpointManifest(
        job="j",
        step=20,
        file=evil.name,
        size=len(blob),
        sha256=hashlib.sha256(blob).hexdigest(),
        epoch=0,
        spec_hash="h1",
        code_version="test",
        created_at=0.0,
    )
    evil.with_suffix(".json").write_bytes(msgspec.json.encode(manifest))
    events = Events()
    loaded = manager(tmp_path, events).load_latest()
    assert not marker.exists(), "the pickle ran code"
    assert loaded is not None
    assert loaded.manifest.step == 10
    assert "does not load" in events.faults()[0].message


def test_retention_keeps_the_last_k(tmp_path: Path) -> None:
    save_steps(manager(tmp_path, Events(), keep=2), 10, 20, 30, 40)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        f"{checkpoint_name(s)}{ext}" for s in (30, 40) for ext in (".json", ".pt")
    ]


def test_remains_of_a_killed_write_are_removed_and_never_loaded(tmp_path: Path) -> None:
    save_steps(manager(tmp_path, Events()), 10)
    (tmp_path / f".{checkpoint_name(20)}.pt.tmp").write_bytes(b"half a checkpoint")
    shutil.copy(
        tmp_path / f"{checkpoint_name(10)}.pt", tmp_path / f"{checkpoint_name(20)}.pt"
    )  # no manifest
    m = manager(tmp_path, Events())
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        f"{checkpoint_name(10)}.json",
        f"{checkpoint_name(10)}.pt",
    ]
    loaded = m.load_latest()
    assert loaded is not None
    assert loaded.manifest.step == 10


def test_checkpoints_of_another_spec_or_a_newer_epoch_are_not_loaded(tmp_path: Path) -> None:
    save_steps(manager(tmp_path, Events()), 10)
    save_steps(manager(tmp_path, Events(), epoch=3), 20)
    save_steps(manager(tmp_path, Events(), spec_hash="other"), 30)
    events = Events()
    loaded = manager(tmp_path, events, epoch=1).load_latest()
    assert loaded is not None
    assert loaded.manifest.step == 10
    assert [f.fault for f in events.faults()] == ["checkpoint_mismatch", "checkpoint_mismatch"]


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 3 MiB tmpfs: a real full disk, not a mocked error."""
    with tmpfs(tmp_path / "disk", "3m") as where:
        yield where


def test_a_full_disk_keeps_the_last_good_checkpoint(small_disk: Path) -> None:
    events = Events()
    m = manager(small_disk, events)
    save_steps(m, 10, size=300_000)  # ~1.2 MB each
    save_steps(m, 20, size=300_000)
    save_steps(m, 30, size=300_000)  # no room: ENOSPC
    faults = events.faults()
    assert [f.fault for f in faults] == ["disk_full"]
    assert faults[0].step == 30
    assert "no space left" in faults[0].message
    assert m.consecutive_failures == 1
    assert not list(small_disk.glob(".*.tmp")), "the partial file is removed"
    loaded = manager(small_disk, Events()).load_latest()
    assert loaded is not None
    assert loaded.manifest.step == 20, "the newest good checkpoint survives"
    save_steps(m, 40, size=300_000)  # pruning made room again
    assert m.consecutive_failures == 0


def test_a_single_hosts_checkpoint_loads_as_a_group_of_ones_shard(tmp_path: Path) -> None:
    """A job on one host supervised as a group of one (issue 30) starts its executor as node
    rank 0 of 1: the checkpoints its single-host executor wrote before (node rank None) are
    that shard, whole; never another member's of a larger group."""
    save_steps(manager(tmp_path, Events()), 10)
    loaded = manager(tmp_path, Events(), node_rank=0, nnodes=1).load_latest()
    assert loaded is not None and loaded.manifest.step == 10
    assert loaded.manifest.node_rank is None  # written by the single host's executor
    events = Events()
    assert manager(tmp_path, events, node_rank=1, nnodes=2).load_latest() is None
    assert [f.fault for f in events.faults()] == ["checkpoint_corrupt"]
