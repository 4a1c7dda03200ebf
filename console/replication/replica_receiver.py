"""The program that receives a replica on an SSH spare, run there as ``python -I -S -c`` with
``replica_rules``' source before it (hence the guarded import) and its idle timeout as argument.

Over stdin: one JSON header line (folder, step, size, sha256, manifest, kept, floor, resume,
files), then the data: a file's bytes, or a folder checkpoint's files one after another in
path order (``files``: [path, size, sha256] each, checked by ``check_files`` before anything
is written: a host's word is no path to write to). Over stdout, one JSON line at a time:
``ready`` (with the disk and the bytes of a part kept for a resume) or ``full`` (nothing
written), then ``ok`` (the older replicas that stay, the disk after the prune), ``short`` (the
stream ended early: the part stays, for a resume), ``corrupt`` (a file's sha256 differs: the
part is gone), ``error`` with the errno of an OS error (the parts are gone), or ``timeout``
when no input came for the idle timeout. The standard library only.
"""

import hashlib
import json
import os
import select
import shutil
import sys

try:  # on the spare these are defined by replica_rules' source, run just before this file
    from console.replication.replica_rules import (
        blocks,
        check_files,
        keep_after,
        keep_before,
        room,
        split_older,
        step_stem,
        survey,
    )
except ImportError:
    pass

BLOCK = 1 << 20
_pending = bytearray()
_doing = ["start"]
"""What the program is at, for the message of an OS error."""


def say(**fields):
    os.write(1, (json.dumps(fields) + "\n").encode())


def wait_input(idle):
    if not select.select([0], [], [], idle)[0]:
        say(timeout=idle, what=_doing[0])
        sys.exit(5)


def read_header(idle):
    while b"\n" not in _pending:
        wait_input(idle)
        block = os.read(0, 1 << 16)
        if not block:
            sys.exit(5)
        _pending.extend(block)
    line, _, rest = bytes(_pending).partition(b"\n")
    _pending[:] = rest
    return json.loads(line)


def disk(folder):
    st = os.statvfs(folder)
    return [st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize, st.f_frsize]


def rm(path):
    """A file or a folder gone (a link is unlinked, never followed)."""
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)
    except FileNotFoundError:
        pass


def remove_steps(folder, steps):
    for s in steps:
        stem = os.path.join(folder, step_stem(s))
        rm(stem + ".json")  # the manifest first: never a manifest without data
        rm(stem + ".pt")


def write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def hash_part(path, have, h):
    """Hash the first ``have`` bytes of a part kept for a resume; False if it is shorter."""
    with open(path, "rb") as f:
        left = have
        while left:
            block = f.read(min(left, 4 * BLOCK))
            if not block:
                return False
            h.update(block)
            left -= len(block)
    return True


def pieces(h, part):
    """Where the stream's bytes go, in order: (path, size, sha256) per file; one for a file
    checkpoint (the part itself), one per listed file under the part for a folder."""
    if h.get("files") is None:
        return [(part, h["size"], h["sha256"])]
    return [(os.path.join(part, *p.split("/")), n, d) for p, n, d in sorted(map(tuple, h["files"]))]


def kept(part, todo, folder):
    """What a part kept for a resume holds: the whole files (each verified), the stream's
    bytes in it, and the hash of those bytes of the file after the whole ones."""
    if os.path.exists(part) and os.path.isdir(part) != folder:
        rm(part)  # a part of the other kind (file or folder)
    done, have = 0, 0
    for path, size, digest in todo:
        hashed = hashlib.sha256()
        try:
            n = os.stat(path).st_size
        except (FileNotFoundError, NotADirectoryError):
            return done, have, hashed
        if n > size or not hash_part(path, n, hashed):
            return done, have, hashlib.sha256()
        if n < size:
            return done, have + n, hashed
        if hashed.hexdigest() != digest:
            rm(part)
            return 0, 0, hashlib.sha256()
        done, have = done + 1, have + n
    return done, have, hashlib.sha256()


def take(n, idle):
    """Up to ``n`` bytes of input (what came with the header first); b"" at its end."""
    if _pending:
        block = bytes(_pending[:n])
        del _pending[:n]
        return block
    wait_input(idle)
    return os.read(0, min(BLOCK, n))


def write_file(path, size, start, h, idle):
    """The stream's bytes into ``path`` from ``start`` to ``size``, hashed into ``h`` as
    written, fsynced; the file's size at the end (short when the input ended early)."""
    _doing[0] = "write " + path
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        os.ftruncate(fd, start)
        os.lseek(fd, start, os.SEEK_SET)
        got = start
        while got < size:
            block = take(size - got, idle)
            if not block:
                break
            h.update(block)
            write_all(fd, block)
            got += len(block)
        os.fsync(fd)
    finally:
        os.close(fd)
    return got


def write_data(part, todo, done, have, h, idle, folder):
    """The files from the ``done``-th on, the first from byte ``have`` of the stream on:
    (None, bytes) when all are in and verified, ("short", bytes) when the input ended early,
    ("corrupt", (sha256, path)) when a file does not hash to its sha256."""
    at = sum(size for _, size, _ in todo[:done])
    if folder:
        _doing[0] = "mkdir " + part
        os.makedirs(part, exist_ok=True)
    for path, size, digest in todo[done:]:
        if folder:
            os.makedirs(os.path.dirname(path), exist_ok=True)
        got = write_file(path, size, have - at, h, idle)
        if got < size:
            return "short", at + got
        if h.hexdigest() != digest:
            return "corrupt", (h.hexdigest(), os.path.relpath(path, part) if folder else "")
        at, have, h = at + size, at + size, hashlib.sha256()
    return None, at


def fsync_path(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish(stem, manifest, folder):
    """Data into place, then the manifest (which makes the replica complete), then the folder."""
    part, data = stem + ".pt.part", stem + ".pt"
    if os.path.isdir(part):
        _doing[0] = "fsync " + part
        for here, _dirs, _files in os.walk(part, topdown=False):
            fsync_path(here)
    if os.path.isdir(part) or os.path.isdir(data):  # a rename replaces no folder
        _doing[0] = "remove " + data
        rm(stem + ".json")
        rm(data)
    _doing[0] = "rename " + part
    os.rename(part, data)
    _doing[0] = "write " + stem + ".json.part"
    fd = os.open(stem + ".json.part", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        write_all(fd, manifest)
        os.fsync(fd)
    finally:
        os.close(fd)
    _doing[0] = "rename " + stem + ".json.part"
    os.rename(stem + ".json.part", stem + ".json")
    fsync_path(folder)


def prune_first(h, part):
    """Drop leftovers (but a part kept for a resume) and what this copy retires; the older
    complete replicas that stay."""
    folder, step = h["folder"], h["step"]
    _doing[0] = "mkdir " + folder
    os.makedirs(folder, exist_ok=True)
    _doing[0] = "list " + folder
    complete, leftovers = survey(os.listdir(folder))
    retire, older = split_older(complete, step, keep_before(h["kept"]))
    _doing[0] = "prune " + folder
    for name in leftovers:
        if not (h["resume"] and name == os.path.basename(part)):
            rm(os.path.join(folder, name))
    remove_steps(folder, retire)
    return older


def unsound(h):
    """Why a folder's list of files cannot be written (checked before anything is)."""
    if h.get("files") is None:
        return None
    try:
        return check_files([tuple(f) for f in h["files"]], h["size"], h["sha256"])
    except (TypeError, ValueError):
        return "manifest: an odd list of files"


def receive(h, idle):
    folder, step, size = h["folder"], h["step"], h["size"]
    why = unsound(h)
    if why is not None:
        say(error=why, errno=None, what="check the manifest of step " + str(step))
        return 1
    stem = os.path.join(folder, step_stem(step))
    part = stem + ".pt.part"
    is_folder = h.get("files") is not None
    todo = pieces(h, part)
    older = prune_first(h, part)
    done, have, hashed = 0, 0, hashlib.sha256()
    if h["resume"]:
        done, have, hashed = kept(part, todo, is_folder)
    _doing[0] = "statvfs " + folder
    free, _total, block = d = disk(folder)
    manifest = h["manifest"].encode()
    sizes = [n for _, n, _ in todo] if is_folder else None
    need, reserve = room(size, len(manifest), block, h["floor"], sizes)
    if free + blocks(have, block) < need + reserve:  # a kept part holds some of it already
        say(full=True, disk=d, need=need, reserve=reserve)
        return 0
    say(ready=True, disk=d, have=have)
    try:
        trouble, got = write_data(part, todo, done, have, hashed, idle, is_folder)
    except OSError:
        rm(part)
        raise
    if trouble == "short":
        say(short=got)
        return 3
    if trouble == "corrupt":
        rm(part)
        say(corrupt=got[0], path=got[1])
        return 4
    try:
        publish(stem, manifest, folder)
    except OSError:
        rm(part)
        rm(stem + ".json.part")
        raise
    retire, older = split_older(older, step, keep_after(h["kept"]))
    d = None
    try:
        remove_steps(folder, retire)
        d = disk(folder)
    except OSError:
        pass  # the next copy prunes it; this replica is complete all the same
    say(ok=True, older=older, disk=d, have=have)
    return 0


def main():
    idle = float(sys.argv[1])
    header = read_header(idle)
    try:
        return receive(header, idle)
    except OSError as e:
        say(error=e.strerror or str(e), errno=e.errno, what=_doing[0])
        return 1


if __name__ == "__main__":
    sys.exit(main())
