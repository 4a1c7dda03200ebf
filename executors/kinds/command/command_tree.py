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

import errno
import fcntl
import hashlib
import os
import shutil
import stat
from enum import StrEnum
from pathlib import Path
from typing import NamedTuple

from executors.durable import fsync_dir
from executors.fencing.publish import (
    PUBLISH_MARGIN_S,
    CorruptCheckpoint,
    Fenced,
    LeaseCheck,
    open_regular,
    publish,
)
from protocol.errors import HotspareError
from protocol.spec import CheckpointManifest, FolderFile

_CHUNK = 8 << 20
Entry = tuple[str, int, int]
"""A file of a folder: its path relative to the folder ('/'-separated), size, mtime_ns."""


class NotATree(HotspareError):
    """A folder that holds something other than regular files and folders."""

    permanent = True


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


FICLONE = 0x40049409
"""ioctl: make a file share another's blocks, copy-on-write (btrfs, XFS, bcachefs, ...)."""
_NO_CLONE = {errno.EOPNOTSUPP, errno.ENOTTY, errno.EXDEV, errno.EINVAL, errno.EBADF, errno.ENOSYS}


class How(StrEnum):
    """How a checkpoint reached the workdir."""

    REFLINK = "reflink"
    """Its own inode sharing the command's blocks, copy-on-write: no bytes written."""
    LINK = "link"
    """A hard link: the command's inode itself, no bytes written."""
    COPY = "copy"


def _hash(path: Path) -> tuple[int, str]:
    """Size and sha256 of a regular file, fsynced (a linked inode's data may not be yet)."""
    sha, size = hashlib.sha256(), 0
    with open_regular(path) as f:
        while chunk := f.read(_CHUNK):
            sha.update(chunk)
            size += len(chunk)
        os.fsync(f.fileno())
    return size, sha.hexdigest()


def clone_file(src: Path, dst_tmp: Path, *, link: bool) -> tuple[int, str, How]:
    """``dst_tmp`` holds ``src``'s bytes with no second copy where the filesystem allows: a
    reflink (copy-on-write: safe whatever the command does next), else with ``link`` a hard
    link (the same inode: only for files the command writes once, never for one it rewrites in
    place), else a copy. Its size and sha256, read from ``dst_tmp``, and how."""
    try:
        with open_regular(src) as fin, open(dst_tmp, "wb") as fout:
            fcntl.ioctl(fout.fileno(), FICLONE, fin.fileno())
        size, sha = _hash(dst_tmp)
        return size, sha, How.REFLINK
    except OSError as e:
        dst_tmp.unlink(missing_ok=True)
        if e.errno not in _NO_CLONE:
            raise
    if link and stat.S_ISREG(os.lstat(src).st_mode):  # a symlink is copied, never linked
        try:
            os.link(src, dst_tmp, follow_symlinks=False)
        except OSError as e:
            if e.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
                raise
        else:
            try:
                size, sha = _hash(dst_tmp)
            except BaseException:
                dst_tmp.unlink(missing_ok=True)
                raise
            return size, sha, How.LINK
    size, sha = copy_file(src, dst_tmp)
    return size, sha, How.COPY


def copy_tree(
    src: Path, dst_tmp: Path, paths: list[str], *, link: bool = False, hows: set[How] | None = None
) -> list[FolderFile]:
    """Copy the files ``paths`` of folder ``src`` into a new folder ``dst_tmp``, each fsynced,
    and every folder too; what each copied file held. ``dst_tmp`` is removed on failure.
    Each file is a reflink where the filesystem allows, with ``link`` a hard link where not
    (``clone_file``)."""
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
            size, sha, how = clone_file(src / rel, target, link=link)
            if hows is not None:
                hows.add(how)
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


class Staged(NamedTuple):
    size: int
    sha256: str
    files: list[FolderFile] | None
    """A folder's files; None for a file."""
    how: How
    """How its bytes came (a folder's: the costliest way any of its files did)."""


def stage_folder(
    src: Path, entries: tuple[Entry, ...], tmp: Path, *, link: bool = False
) -> Staged | None:
    """Take a complete folder into ``tmp`` (each file as ``clone_file`` may); None (``tmp``
    gone) if it changed while copied, so it was not complete after all."""
    hows: set[How] = set()
    copied = copy_tree(src, tmp, [rel for rel, _, _ in entries], link=link, hows=hows)
    try:
        after = listing(src)
    except (NotATree, OSError):
        after = None
    if after != entries or [(f.path, f.size) for f in copied] != [e[:2] for e in entries]:
        remove(tmp)
        return None
    how = next((h for h in (How.COPY, How.LINK, How.REFLINK) if h in hows), How.COPY)
    return Staged(sum(f.size for f in copied), tree_digest(copied), copied, how)


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
    src: Path,
    entries: tuple[Entry, ...] | None,
    size: int,
    mtime_ns: int,
    tmp: Path,
    *,
    link: bool = False,
) -> Staged | None:
    """Take a complete checkpoint, as judged, into ``tmp`` (a reflink; with ``link`` a hard
    link where a reflink is not to be had; else a copy): its size, sha256 and a folder's files;
    None (``tmp`` gone) if it changed meanwhile, so it was not complete after all."""
    if entries is not None:
        return stage_folder(src, entries, tmp, link=link)
    copied, sha, how = clone_file(src, tmp, link=link)
    st = src.stat()
    if (st.st_size, st.st_mtime_ns) != (size, mtime_ns) or copied != size:
        tmp.unlink(missing_ok=True)
        return None
    return Staged(size, sha, None, how)


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
    copied, sha, _ = clone_file(data, tmp, link=False)
    if (copied, sha) != (size, sha256):
        tmp.unlink(missing_ok=True)
        raise CorruptCheckpoint(
            f"size {copied} and sha256 {sha[:12]}… do not match the manifest's "
            f"{size} and {sha256[:12]}…"
        )
