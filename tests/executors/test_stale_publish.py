"""A write the writer could not confirm inside its lease is refused by every reader.

A publisher ends between its renames and the check that confirms them (``os._exit`` from the
lease check after the renames: a process ended by the watchdog while a rename on slow storage
hung, a SIGKILL, a freeze past the lease). Its checkpoint is whole on disk (size and sha256
match), yet the torch kind's loader skips it for the previous one, and the console's listing
of the folder on a host (what a failover copies from) leaves it out.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from support.checkpointbed import Events, manager, save_steps
from support.helpers import REPO

from console.reach.remote import list_manifests
from console.reach.transport.local import LocalTransport
from executors.checkpoints.checkpoint import checkpoint_name
from executors.fencing.publish import CorruptCheckpoint, read_manifest

DIES_MID_PUBLISH = r"""
import os, sys, torch
from pathlib import Path
from executors.checkpoints.checkpoint import CheckpointManager
calls = []
def lease_valid(margin):
    calls.append(margin)
    if len(calls) == 2:  # after the renames, before they are confirmed: the process ends
        os._exit(77)
    return True
m = CheckpointManager(Path(sys.argv[1]), job="j", spec_hash="h1", keep=3, epoch=0,
                      code_version="test", emit=lambda msg: None, lease_valid=lease_valid)
m.save(30, {"model": {"w": torch.full((1000,), 30.0)}, "train": {"step": 30}})
m.wait()
"""


def die_mid_publish(folder: Path) -> None:
    """Steps 10 and 20 published, then 30 by a publisher that dies before confirming it."""
    save_steps(manager(folder, Events()), 10, 20)
    done = subprocess.run(
        [sys.executable, "-c", DIES_MID_PUBLISH, str(folder)], cwd=REPO, timeout=120
    )
    assert done.returncode == 77, "the publisher died between its renames and the confirmation"


def test_a_publish_never_confirmed_is_loaded_nowhere(tmp_path: Path) -> None:
    die_mid_publish(tmp_path)
    stale = tmp_path / f"{checkpoint_name(30)}.json"
    assert stale.exists() and stale.with_suffix(".pt").exists(), "its files are in place, whole"
    with pytest.raises(CorruptCheckpoint, match="never confirmed"):
        read_manifest(stale)
    events = Events()
    loaded = manager(tmp_path, events).load_latest()
    assert loaded is not None and loaded.manifest.step == 20
    assert any(checkpoint_name(30) in f.message for f in events.faults()), "the skip is an event"


async def test_the_consoles_listing_of_a_host_leaves_an_unconfirmed_publish_out(
    tmp_path: Path,
) -> None:
    die_mid_publish(tmp_path)
    assert (tmp_path / f"{checkpoint_name(30)}.json").exists()
    listed = await list_manifests(LocalTransport("h"), sys.executable, str(tmp_path))
    assert [m.step for m in listed] == [10, 20]
