"""The state store, the lease's bound and the journal on a disk that fills: a save is durable
(the folder fsynced after the rename), a failed one raises nothing and leaves the file on disk
whole, a lease is never granted past the bound on disk, and journal lines held back are
written whole and in order once there is room.

A real small tmpfs mounted by the test (root needed), filled to the last byte with a file;
strace (where it runs) shows the system calls a save makes.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.helpers import REPO, env_with, fill_disk, tmpfs

from console import clock
from console.records.journal import Journal, Kind, read
from console.records.state_store import StateStore, Unsaved
from console.supervise.lease import JobLease, NoAnchor


class _Link:
    def __init__(self, anchor: tuple[float, float]) -> None:
        self.anchor = anchor


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs, unmounted after the test."""
    with tmpfs(tmp_path / "disk", "64k") as where:
        yield where


def fill(disk: Path) -> Path:
    return fill_disk(disk)


SAVE = """
import sys
from pathlib import Path
from console.records.state_store import StateStore
store = StateStore(Path(sys.argv[1]))
store.job("j").epoch = 7
store.save()
"""


def test_a_save_fsyncs_the_file_then_renames_it_then_fsyncs_its_folder(tmp_path: Path) -> None:
    if shutil.which("strace") is None:
        pytest.skip("strace is not installed")
    state = tmp_path / "state"
    state.mkdir()
    trace = tmp_path / "trace"
    done = subprocess.run(
        [
            "strace",
            "-f",
            "-y",
            "-o",
            str(trace),
            "-e",
            "trace=fsync,fdatasync,rename,renameat,renameat2",
            sys.executable,
            "-c",
            SAVE,
            str(state),
        ],
        capture_output=True,
        text=True,
        env=env_with(),
        cwd=REPO,
        timeout=60,
    )
    if done.returncode != 0 and "ptrace" in done.stderr:
        pytest.skip(f"strace cannot trace here: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr
    calls = []
    for line in trace.read_text().splitlines():
        m = re.search(r"(fsync|fdatasync|rename\w*)\((.*)\)\s+= 0", line)
        if m and str(state) in m.group(2):
            calls.append((m.group(1), m.group(2)))
    kinds = [
        "rename" if name.startswith("rename") else "file" if ".state.json.tmp" in args else "folder"
        for name, args in calls
    ]
    assert kinds == ["file", "rename", "folder"], calls
    assert json.loads((state / "state.json").read_text())["jobs"]["j"]["epoch"] == 7


def test_a_save_on_a_full_disk_raises_nothing_and_leaves_the_file_whole(disk: Path) -> None:
    store = StateStore(disk)
    told: list[str | None] = []
    store.on_trouble(told.append)
    store.job("j").epoch = 1
    assert store.save()
    before = (disk / "state.json").read_bytes()
    filler = fill(disk)
    store.job("j").epoch = 2
    store.job("j").spares = ["b" * 200] * 50  # more than any slack the disk has left
    assert store.save() is False
    assert store.save() is False
    with pytest.raises(Unsaved, match="No space left on device"):
        store.persist()
    assert (disk / "state.json").read_bytes() == before, "the file on disk is the one before"
    assert not (disk / ".state.json.tmp").exists(), "no temp file left filling the disk"
    assert store.unsaved is not None and "No space left on device" in store.unsaved
    assert len(told) == 1 and told[0] == store.unsaved, "told once, not per save"
    filler.unlink()
    assert store.save()
    assert json.loads((disk / "state.json").read_text())["jobs"]["j"]["epoch"] == 2
    assert store.unsaved is None and told[1:] == [None], "told once that it works again"


def test_no_lease_is_granted_past_the_bound_on_disk(disk: Path) -> None:
    store = StateStore(disk)
    rec = store.job("j")
    rec.epoch = 1
    ttl = 9.0
    lease = JobLease(rec, store.persist, ttl_s=ttl, skew_s=0.5)
    t0 = clock.mono() - 60  # readings that arrived a while ago (the arithmetic is the same)
    lease.renewal(_Link((100.0, t0)), "a", 1)  # type: ignore[arg-type]

    def on_disk() -> float:
        return json.loads((disk / "state.json").read_bytes())["jobs"]["j"]["lease"]["until"]

    bound = on_disk()
    assert bound >= t0 + ttl, "the bound on disk covers the lease granted"
    filler = fill(disk)
    granted, refused = [], []
    for i in range(25):  # a reading every 0.25 s for 6 s, the disk full throughout
        arrived = t0 + i / 4
        try:
            lease.renewal(_Link((100.0 + i / 4, arrived)), "a", 1)  # type: ignore[arg-type]
        except NoAnchor:
            refused.append(arrived)
        else:
            granted.append(arrived)
    assert granted and refused, "renewals go on while the bound on disk covers them, then stop"
    assert granted[0] == t0, "one the bound on disk covers is granted"
    assert max(granted) + ttl <= bound, "every lease granted ends within the bound on disk"
    assert min(refused) + ttl > bound, "refused only once the bound no longer covers it"
    assert max(granted) < min(refused)
    assert on_disk() == bound, "the file is untouched (and whole)"
    with pytest.raises(NoAnchor, match="no lease past the bound on disk"):
        lease.renewal(_Link((110.0, t0 + 8)), "a", 1)  # type: ignore[arg-type]
    with pytest.raises(NoAnchor):  # a new epoch's lease is never covered by the old one's
        lease.renewal(_Link((100.25, t0 + 0.25)), "a", 2)  # type: ignore[arg-type]
    filler.unlink()
    lease.renewal(_Link((110.0, t0 + 8)), "a", 1)  # type: ignore[arg-type]
    assert on_disk() >= t0 + 8 + ttl, "room again: granted, its bound written first"


def test_journal_lines_a_full_disk_held_back_are_written_whole_and_in_order(disk: Path) -> None:
    path = disk / "journal.jsonl"
    journal = Journal(path)
    heard: list[str] = []
    journal.subscribe(lambda e: heard.append(e.msg))
    journal.record(Kind.CONSOLE, "before")
    filler = fill(disk)
    for i in range(200):  # some may fit in the last block's slack, the rest cannot
        journal.record(Kind.ACTION, f"while full {i}", data={"pad": "x" * 100})
    assert heard == ["before", *(f"while full {i}" for i in range(200))], "told at once"
    assert journal.unwritten is not None and "No space left on device" in journal.unwritten
    assert not journal.flush()
    filler.unlink()
    journal.record(Kind.ACTION, "after")
    journal.close()
    assert path.read_bytes().endswith(b"\n")
    msgs = [e.msg for e in read(path)]
    assert msgs == ["before", *(f"while full {i}" for i in range(200)), "after"]
    assert journal.unwritten is None
