"""Copying the command kind's checkpoints, files or folders (torch.distributed.checkpoint
writes a folder per step), into the workdir and back, verified.

A folder is judged by its listing (every regular file under it, with size and mtime): it is
complete once its marker is newer than everything else in it, or once the listing stayed the
same for ``settle_s``. Its durable copy is a folder too, and its manifest lists every file
with size and sha256 (``CheckpointManifest.files``); the manifest's ``sha256`` is
``tree_digest`` of that list, so one digest still names the whole checkpoint. A folder that
holds anything but regular files and folders (a link, a FIFO) is never a checkpoint.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
from pathlib import Path

from executors.durable import fsync_dir
from executors.publish import (
    PUBLISH_MARGIN_S,
    CorruptCheckpoint,
    Fenced,
    LeaseCheck,
    open_regular,
    publish,
)
from protocol.spec import CheckpointManifest, FolderFile

_CHUNK = 8 << 20
Entry = tuple[str, int, int]
"""A file of a folder: its path relative to the folder ('/'-separated), size, mtime_ns."""


class NotATree(Exception):
    """A folder that holds something other than regular files and folders."""


def listing(folder: Path) -> tuple[Entry, ...]:
    """Every regular file under ``folder``, sorted by path; NotATree for anything else."""
    found: list[Entry] = []
    pending = [(folder, "")]
    while pending:
        here, prefix = pending.pop()
        with os.scandir(here) as it:
            for entry in it:
                rel = f"{prefix}{entry.name}"
                st = entry.stat(follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    pending.append((Path(entry.path), f"{rel}/"))
                elif stat.S_ISREG(st.st_mode):
                    found.append((rel, st.st_size, st.st_mtime_ns))
                else:
                    raise NotATree(f"{folder}: {rel} is not a regular file or folder")
    return tuple(sorted(found))


def safe_relpath(rel: str) -> bool:
    """A path a manifest may name inside a folder: relative, no '..' or '.' part, no NUL."""
    return (
        bool(rel)
        and "\0" not in rel
        and all(part not in ("", ".", "..") for part in rel.split("/"))
    )


def tree_digest(files: list[FolderFile]) -> str:
    """sha256 over one line ``SHA256 SIZE PATH`` per file, in path order."""
    h = hashlib.sha256()
    for f in sorted(files, key=lambda f: f.path):
        h.update(f"{f.sha256} {f.size} {f.path}\n".encode())
    return h.hexdigest()


def copy_file(src: Path, dst_tmp: Path) -> tuple[int, str]:
    """Copy ``src`` (a regular file) to ``dst_tmp`` (fsynced); its size and sha256."""
    sha, size = hashlib.sha256(), 0
    try:
        with open_regular(src) as fin, open(dst_tmp, "wb") as fout:
            while chunk := fin.read(_CHUNK):
                sha.update(chunk)
                size += len(chunk)
                fout.write(chunk)
            fout.flush()
            os.fsync(fout.fileno())
    except BaseException:
        dst_tmp.unlink(missing_ok=True)
        raise
    return size, sha.hexdigest()


def copy_tree(src: Path, dst_tmp: Path, paths: list[str]) -> list[FolderFile]:
    """Copy the files ``paths`` of folder ``src`` into a new folder ``dst_tmp``, each fsynced,
    and every folder too; what each copied file held. ``dst_tmp`` is removed on failure."""
    try:
        dst_tmp.mkdir()
        folders = {dst_tmp}
        files = []
        for rel in paths:
            if not safe_relpath(rel):
                raise CorruptCheckpoint(f"{rel!r} is not a path inside a folder")
            target = dst_tmp / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            folders.add(target.parent)
            size, sha = copy_file(src / rel, target)
            files.append(FolderFile(path=rel, size=size, sha256=sha))
        for folder in sorted(folders, key=lambda p: len(p.parts), reverse=True):
            fsync_dir(folder)
    except BaseException:
        remove(dst_tmp)
        raise
    return files


def remove(path: Path) -> None:
    """A checkpoint gone, file or folder (a link is removed, never followed)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def stage_folder(
    src: Path, entries: tuple[Entry, ...], tmp: Path
) -> tuple[int, str, list[FolderFile]] | None:
    """Copy a complete folder into ``tmp``: its total size, digest and files; None (``tmp``
    gone) if it changed while copied, so it was not complete after all."""
    copied = copy_tree(src, tmp, [rel for rel, _, _ in entries])
    try:
        after = listing(src)
    except (NotATree, OSError):
        after = None
    if after != entries or [(f.path, f.size) for f in copied] != [e[:2] for e in entries]:
        remove(tmp)
        return None
    return sum(f.size for f in copied), tree_digest(copied), copied


def restore_folder(src: Path, tmp: Path, files: list[FolderFile], size: int, sha256: str) -> None:
    """Copy a folder checkpoint into ``tmp`` and check every file against its manifest;
    CorruptCheckpoint (``tmp`` gone) naming the first that differs."""
    if tree_digest(files) != sha256 or sum(f.size for f in files) != size:
        raise CorruptCheckpoint("its list of files does not match its size and sha256")
    copied = copy_tree(src, tmp, [f.path for f in files])
    for want, got in zip(files, copied, strict=True):
        if (got.size, got.sha256) != (want.size, want.sha256):
            remove(tmp)
            raise CorruptCheckpoint(
                f"{want.path}: size {got.size} and sha256 {got.sha256[:12]}… do not match the "
                f"manifest's {want.size} and {want.sha256[:12]}…"
            )


def judge(path: Path) -> tuple[int, int, tuple[Entry, ...] | None] | None:
    """A checkpoint as it is now: size, mtime_ns and, for a folder, its files (their sum and
    newest mtime); None for an empty folder or anything but a regular file or folder."""
    try:
        st = path.stat()
        if stat.S_ISREG(st.st_mode):
            return st.st_size, st.st_mtime_ns, None
        if not stat.S_ISDIR(st.st_mode):
            return None
        entries = listing(path)
    except (OSError, NotATree):
        return None
    if not entries:
        return None
    return sum(e[1] for e in entries), max(e[2] for e in entries), entries


def stage(
    src: Path, entries: tuple[Entry, ...] | None, size: int, mtime_ns: int, tmp: Path
) -> tuple[int, str, list[FolderFile] | None] | None:
    """Copy a complete checkpoint, as judged, to ``tmp``: its size, sha256 and a folder's files;
    None (``tmp`` gone) if it changed meanwhile, so it was not complete after all."""
    if entries is not None:
        return stage_folder(src, entries, tmp)
    copied, sha = copy_file(src, tmp)
    st = src.stat()
    if (st.st_size, st.st_mtime_ns) != (size, mtime_ns) or copied != size:
        tmp.unlink(missing_ok=True)
        return None
    return size, sha, None


def put(tmp: Path, data_path: Path, manifest: CheckpointManifest, lease_valid: LeaseCheck) -> Path:
    """``publish`` a file or a folder; the manifest's path. A folder cannot replace an older
    copy of its step, which goes first (inside the lease)."""
    if manifest.files is None and not data_path.is_dir():
        return publish(tmp, data_path, manifest, lease_valid)
    if not lease_valid(PUBLISH_MARGIN_S):
        remove(tmp)
        raise Fenced(f"checkpoint {manifest.step} not published: the lease is ending")
    data_path.with_suffix(".json").unlink(missing_ok=True)
    remove(data_path)
    return publish(tmp, data_path, manifest, lease_valid)


def restore_file(data: Path, tmp: Path, size: int, sha256: str) -> None:
    """Copy a file checkpoint into ``tmp``; CorruptCheckpoint (``tmp`` gone) if it differs."""
    copied, sha = copy_file(data, tmp)
    if (copied, sha) != (size, sha256):
        tmp.unlink(missing_ok=True)
        raise CorruptCheckpoint(
            f"size {copied} and sha256 {sha[:12]}… do not match the manifest's "
            f"{size} and {sha256[:12]}…"
        )
