"""No double writes (issue 28): a command's checkpoint is published without a second copy on
disk where the filesystem allows (a reflink; a hard link for files the command writes once),
never by hard link for a file it rewrites in place, and the command's own old files are pruned
to what is published and kept. The evidence is the filesystem's: inodes, link counts, the
bytes' sha256, which files exist."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import pytest
import tomli_w
from support.helpers import run_job

from executors.kinds.command.command_files import Publisher, Watcher
from executors.kinds.command.command_tree import How, clone_file
from protocol.spec import CommandSpec

REPO = Path(__file__).resolve().parents[2]
PLAIN = REPO / "tests" / "train_plain.py"
NANOGPT = REPO / "tests" / "train_nanogpt_style.py"
PROGRESS = r"step (?P<step>\d+) loss (?P<loss>[0-9.]+)"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def published(workdir: Path) -> dict[int, Path]:
    return {
        json.loads(m.read_text())["step"]: m.with_suffix(".pt")
        for m in (workdir / "checkpoints").glob("step-*.json")
    }


def manifest_sha(data: Path) -> str:
    return json.loads(data.with_suffix(".json").read_text())["sha256"]


def said(proc: object, prefix: str) -> list[str]:
    return [e["text"] for e in proc.of("log") if e["text"].startswith(prefix)]  # type: ignore[attr-defined]


def plain_job(tmp_path: Path, **command: object) -> Path:
    argv = [sys.executable, str(PLAIN), "--checkpoint-dir", "{checkpoint_dir}"]
    table = {
        "argv": [*argv, "--steps", "{steps}", "--save-every", "10", "--marker"],
        "env": {"OMP_NUM_THREADS": "1"},
        "checkpoint_glob": "ckpt-*.pt",
        "complete_marker": "{name}.done",
        "progress_regex": PROGRESS,
        **command,
    }
    spec = {"name": "plain", "executor": "command", "steps": 60, "keep_checkpoints": 3}
    path = tmp_path / "job.toml"
    path.write_text(tomli_w.dumps({**spec, "command": table}))
    return path


def test_numbered_files_are_published_without_a_second_copy_and_old_ones_pruned(
    tmp_path: Path,
) -> None:
    workdir = tmp_path / "w"
    proc = run_job(plain_job(tmp_path), workdir)
    assert proc.returncode == 0, proc.stderr
    pub = published(workdir)
    assert sorted(pub) == [40, 50, 60], "keep_checkpoints = 3"
    own = {int(p.stem.split("-")[1]): p for p in (workdir / "ckpt").glob("ckpt-*.pt")}
    assert sorted(own) == [40, 50, 60], "the command's own older files were pruned"
    assert sorted(p.name for p in (workdir / "ckpt").glob("*.done")) == [
        f"ckpt-{s}.pt.done" for s in (40, 50, 60)
    ], "their markers went with them"
    (how,) = said(proc, "checkpoints are published into")
    for step, data in pub.items():
        assert sha256(data) == manifest_sha(data), "the published bytes are what the manifest says"
        if "hard links" in how:
            assert os.stat(data).st_ino == os.stat(own[step]).st_ino, "one inode, no copy"
            assert os.stat(data).st_nlink == 2
        else:
            assert "reflinks" in how, how  # copy-on-write: its own inode, no bytes written
            assert os.stat(data).st_ino != os.stat(own[step]).st_ino


def test_prune_false_leaves_every_file_the_command_wrote(tmp_path: Path) -> None:
    workdir = tmp_path / "w"
    proc = run_job(plain_job(tmp_path, prune=False), workdir)
    assert proc.returncode == 0, proc.stderr
    assert sorted(published(workdir)) == [40, 50, 60]
    own = sorted(int(p.stem.split("-")[1]) for p in (workdir / "ckpt").glob("ckpt-*.pt"))
    assert own == [10, 20, 30, 40, 50, 60]


def test_a_file_rewritten_in_place_is_never_hard_linked(tmp_path: Path) -> None:
    """nanoGPT's torch.save over ckpt.pt truncates the same inode: a hard link would be
    rewritten under the published copy. Each published copy keeps the bytes its manifest names
    after the command rewrote the file again and again."""
    argv = [sys.executable, str(NANOGPT), "--out_dir={checkpoint_dir}", "--max_iters={steps}"]
    table = {
        "argv": [*argv, "--eval_interval=20", "--iter_s=0.05"],  # a write a second
        "env": {"OMP_NUM_THREADS": "1"},
        "checkpoint_file": "ckpt.pt",
        "settle_s": 0.1,
        "progress_regex": r"iter (?P<step>\d+): loss (?P<loss>[0-9.]+)",
    }
    spec = {"name": "nano", "executor": "command", "steps": 80, "keep_checkpoints": 3}
    job = tmp_path / "job.toml"
    job.write_text(tomli_w.dumps({**spec, "command": table}))
    workdir = tmp_path / "w"
    proc = run_job(job, workdir)
    assert proc.returncode == 0, proc.stderr
    pub = published(workdir)
    assert len(pub) >= 2, pub
    own = workdir / "ckpt" / "ckpt.pt"
    for data in pub.values():
        assert os.stat(data).st_ino != os.stat(own).st_ino
        assert os.stat(data).st_nlink == 1
        assert sha256(data) == manifest_sha(data), "rewritten in place, and the copy held"
    assert not [t for t in said(proc, "checkpoints are published into") if "hard links" in t]


# ----------------------------------------------------------------- clone_file, and a misuse


def test_clone_file_links_copies_across_filesystems_and_never_links_a_symlink(
    tmp_path: Path,
) -> None:
    src = tmp_path / "a.pt"
    src.write_bytes(b"weights" * 1000)
    size, sha, how = clone_file(src, tmp_path / "linked", link=True)
    assert (size, sha) == (7000, sha256(src))
    if how is How.LINK:
        assert os.stat(tmp_path / "linked").st_ino == os.stat(src).st_ino
    _, _, how = clone_file(src, tmp_path / "copied", link=False)
    assert how in (How.COPY, How.REFLINK)
    assert os.stat(tmp_path / "copied").st_ino != os.stat(src).st_ino
    assert sha256(tmp_path / "copied") == sha

    link = tmp_path / "link.pt"
    link.symlink_to(src)
    _, _, how = clone_file(link, tmp_path / "from-symlink", link=True)
    assert how is not How.LINK
    assert not (tmp_path / "from-symlink").is_symlink()
    assert os.stat(tmp_path / "from-symlink").st_ino != os.stat(src).st_ino

    shm = Path("/dev/shm")
    if not shm.is_dir() or os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("no second filesystem here")
    other = shm / f"hotspare-clone-{os.getpid()}"
    try:
        _, got, how = clone_file(src, other, link=True)
        assert how is How.COPY and got == sha, "EXDEV: copied, not failed"
    finally:
        other.unlink(missing_ok=True)


def test_a_linked_checkpoint_the_command_rewrote_is_refused_at_restore_not_loaded(
    tmp_path: Path,
) -> None:
    """A command that rewrites a numbered file after it was published (what a hard link cannot
    protect against) costs that checkpoint, never a silent load of other bytes: the checksum
    refuses it and the restore takes the one before."""
    folder, ours = tmp_path / "ckpt", tmp_path / "checkpoints"
    folder.mkdir()
    cs = CommandSpec(argv=["true"], checkpoint_glob="ckpt-*.pt", settle_s=0)
    events: list[object] = []
    pub = Publisher(
        ours,
        job="j",
        spec_hash="h",
        keep=3,
        epoch=1,
        code_version="v",
        emit=events.append,
        link=True,
    )
    for step in (10, 20):
        (folder / f"ckpt-{step}.pt").write_bytes(f"step {step} ".encode() * 100)
    for cand in Watcher(folder, cs).complete(exited_ok=True):
        assert pub.publish(cand) is not None
    if os.stat(published(tmp_path)[20]).st_nlink < 2:
        pytest.skip("this filesystem gave no hard link (a reflink or a copy is safe anyway)")
    with open(folder / "ckpt-20.pt", "r+b") as f:  # in place, as torch.save over a name does
        f.write(b"other bytes")
    dest = tmp_path / "restore"
    dest.mkdir()
    restored = pub.restore(dest, cs)
    assert restored is not None and restored.manifest.step == 10
    assert restored.path.read_bytes() == b"step 10 " * 100
