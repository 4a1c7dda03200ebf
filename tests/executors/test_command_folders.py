"""Folder checkpoints of the command kind (torch.distributed.checkpoint writes one per step).

A folder is complete by its marker (beside it, or inside it like DCP's ``.metadata``) or when
nothing in it changed for ``settle_s``; it is copied whole with a manifest that lists every
file, restored whole, and a corrupt file in the copy is caught. The end-to-end test runs a
plain DCP script (tests/train_dcp_plain.py), kills it, and resumes it bit-exact.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

import msgspec
import pytest
import tomli_w
from support.helpers import REPO, ExecutorProcess, run_job, wait_for

from executors.agent.workdir import kill_command
from executors.kinds.command.command_files import Candidate, Publisher, Watcher, clear
from executors.kinds.command.command_tree import judge, tree_digest
from protocol.messages import CheckpointSaved, ExecutorMessage, Fault
from protocol.spec import CheckpointManifest, CommandSpec, FolderFile

SCRIPT = REPO / "tests" / "train_dcp_plain.py"
STEPS = 30


def write(path: Path, data: bytes, mtime_ns: int | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    if mtime_ns is not None:
        os.utime(path, ns=(mtime_ns, mtime_ns))


def dcp_like(folder: Path, step: int, *, metadata: bool = True) -> Path:
    """A folder shaped like one dcp.save wrote: shards, a nested file, ``.metadata`` last."""
    ckpt = folder / f"ckpt-{step}"
    write(ckpt / "__0_0.distcp", f"shard 0 of {step}".encode() * 100, 1_000_000_000)
    write(ckpt / "__1_0.distcp", f"shard 1 of {step}".encode(), 1_000_000_000)
    write(ckpt / "extra" / "rng.bin", bytes(range(256)), 1_000_000_000)
    if metadata:
        write(ckpt / ".metadata", b"metadata", 2_000_000_000)
    return ckpt


def spec(**kw: object) -> CommandSpec:
    return CommandSpec(argv=["true"], checkpoint_dir="ckpt", checkpoint_glob="ckpt-*", **kw)


def steps_of(found: list[Candidate]) -> list[int]:
    return [c.step for c in found]


def test_a_folder_is_complete_by_its_marker_inside_or_beside_it(tmp_path: Path) -> None:
    inside = Watcher(tmp_path, spec(complete_marker=".metadata"))
    dcp_like(tmp_path, 10)
    dcp_like(tmp_path, 20, metadata=False)
    assert steps_of(inside.complete()) == [10], "20 has no .metadata yet"
    write(tmp_path / "ckpt-10" / "__1_0.distcp", b"rewritten", 3_000_000_000)
    assert steps_of(inside.complete()) == [], "a file newer than the marker: still writing"

    beside = Watcher(tmp_path, spec(complete_marker="{name}.done"))
    assert steps_of(beside.complete()) == []
    write(tmp_path / "ckpt-20.done", b"", 4_000_000_000)
    (cand,) = beside.complete()
    assert (cand.step, cand.path) == (20, tmp_path / "ckpt-20")
    assert cand.size == sum(e[1] for e in cand.entries or ())
    assert [e[0] for e in cand.entries or ()] == ["__0_0.distcp", "__1_0.distcp", "extra/rng.bin"]


def test_a_folder_without_a_marker_is_complete_once_nothing_in_it_changed(tmp_path: Path) -> None:
    watcher = Watcher(tmp_path, spec(settle_s=0.3))
    ckpt = dcp_like(tmp_path, 10)
    assert watcher.complete() == [], "just seen"
    write(ckpt / "extra" / "late.bin", b"one more file")
    assert watcher.complete() == []
    found = wait_for(watcher.complete, 10, "the folder to settle")
    assert [e[0] for e in found[0].entries] == [
        ".metadata",
        "__0_0.distcp",
        "__1_0.distcp",
        "extra/late.bin",
        "extra/rng.bin",
    ]
    os.symlink("/etc/hostname", ckpt / "link")
    assert judge(ckpt) is None, "a folder holding a link is not a checkpoint"
    (tmp_path / "ckpt-30").mkdir()
    assert judge(tmp_path / "ckpt-30") is None, "an empty folder is not one yet"


def publisher(folder: Path, events: list[ExecutorMessage], keep: int = 2) -> Publisher:
    return Publisher(
        folder, job="j", spec_hash="h", keep=keep, epoch=1, code_version="v", emit=events.append
    )


def tree(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


def test_a_folder_is_copied_listed_file_by_file_restored_whole_and_checked(
    tmp_path: Path,
) -> None:
    cs = spec(complete_marker=".metadata")
    src, events = tmp_path / "ckpt", []
    pub = publisher(tmp_path / "checkpoints", events)
    watcher = Watcher(src, cs)
    for step in (10, 20, 30):
        dcp_like(src, step)
    saved = [pub.publish(c) for c in watcher.complete()]
    assert all(isinstance(s, CheckpointSaved) for s in saved)
    m = saved[-1].manifest  # type: ignore[union-attr]
    original = tree(src / "ckpt-30")
    assert m.files == [
        FolderFile(path=rel, size=len(data), sha256=hashlib.sha256(data).hexdigest())
        for rel, data in original.items()
    ]
    assert (m.size, m.sha256, m.source) == (
        sum(map(len, original.values())),
        tree_digest(m.files),
        "ckpt-30",
    )
    stored = tmp_path / "checkpoints" / "step-0000000030.pt"
    assert stored.is_dir() and tree(stored) == original
    on_disk = msgspec.json.decode(stored.with_suffix(".json").read_bytes(), type=CheckpointManifest)
    assert on_disk == m
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [
        "step-0000000020.json",
        "step-0000000020.pt",
        "step-0000000030.json",
        "step-0000000030.pt",
    ], "keep = 2 purges the oldest folder"

    assert clear(src, cs, watcher) == 3
    assert list(src.iterdir()) == []
    restored = pub.restore(src, cs)
    assert restored is not None and restored.path == src / "ckpt-30"
    assert tree(restored.path) == original

    (stored / "extra" / "rng.bin").write_bytes(b"bit rot")
    clear(src, cs, watcher)
    again = pub.restore(src, cs)
    assert again is not None and again.manifest.step == 20, "30 no longer verifies"
    (fault,) = [e for e in events if isinstance(e, Fault)]
    assert fault.fault == "checkpoint_corrupt"
    assert "extra/rng.bin: size 7 and sha256" in fault.message
    assert sorted(p.name for p in src.iterdir()) == ["ckpt-20"], "nothing half-restored is left"


@pytest.mark.parametrize("ends", ["before", "during"])
def test_a_folder_is_not_published_outside_the_lease(tmp_path: Path, ends: str) -> None:
    """``before``: the lease is ending when the copy is done; ``during``: it ends between the
    renames and the check after them (publish removes the manifest, the folder goes too)."""
    events: list[ExecutorMessage] = []
    pub = Publisher(
        tmp_path / "checkpoints",
        job="j",
        spec_hash="h",
        keep=2,
        epoch=1,
        code_version="v",
        emit=events.append,
        lease_valid=(lambda _m: False) if ends == "before" else (lambda margin: margin > 0),
    )
    dcp_like(tmp_path / "ckpt", 10)
    (cand,) = Watcher(tmp_path / "ckpt", spec(complete_marker=".metadata")).complete()
    assert pub.publish(cand) is None
    (fault,) = [e for e in events if isinstance(e, Fault)]
    assert fault.fault == "lease_lost" and fault.step == 10
    assert list((tmp_path / "checkpoints").iterdir()) == [], "no manifest, folder or temp left"


def write_dcp_job(path: Path, **extra: object) -> Path:
    argv = [sys.executable, str(SCRIPT), "--checkpoint-dir", "{checkpoint_dir}"]
    argv += ["--resume", "{resume_from}", "--steps", "{steps}", "--step-s", "0.05"]
    command = {
        "argv": argv,
        "env": {"OMP_NUM_THREADS": "1"},
        "checkpoint_glob": "ckpt-*",
        "complete_marker": ".metadata",
        "progress_regex": r"step (?P<step>\d+) loss (?P<loss>[0-9.]+)",
        "params_regex": r"^params sha256 (?P<sha256>[0-9a-f]{64})$",
        **extra,
    }
    job = {"name": "dcp", "executor": "command", "steps": STEPS, "keep_checkpoints": 3}
    path.write_text(tomli_w.dumps({**job, "command": command}))
    return path


def test_a_dcp_script_killed_mid_run_resumes_from_its_folder_bit_exact(tmp_path: Path) -> None:
    job = write_dcp_job(tmp_path / "job.toml")
    full = run_job(job, tmp_path / "full")
    assert full.returncode == 0, full.stderr
    digest = full.events[-1]["params_sha256"]
    assert full.events[-1] == {"kind": "finished", "step": STEPS, "params_sha256": digest}

    work = tmp_path / "w"
    first = ExecutorProcess(["run", "--spec", str(job), "--workdir", str(work), "--json"])
    try:
        saved = first.wait_event(
            lambda e: e["kind"] == "checkpoint" and e["manifest"]["step"] >= 10, 60, "step 10"
        )
    finally:
        first.proc.kill()
        first.finish(30)
        kill_command(work)
    manifest = saved["manifest"]
    assert [f["path"] for f in manifest["files"]] == [".metadata", "__0_0.distcp"]
    again = run_job(job, work)
    assert again.returncode == 0, again.stderr
    resumed = again.of("resumed")[0]
    step = resumed["step"]
    assert step >= 10 and resumed["checkpoint"] == str(work / "ckpt" / f"ckpt-{step}")
    assert min(e["manifest"]["step"] for e in again.of("checkpoint")) > step
    assert again.events[-1] == {"kind": "finished", "step": STEPS, "params_sha256": digest}
