"""The program that receives a replica on an SSH spare, run there as ``python -I -S -c`` with
``replica_rules``' source before it (hence the guarded import) and its idle timeout as argument.

Over stdin: one JSON header line (folder, step, size, sha256, manifest, kept, floor, resume),
then the data. Over stdout, one JSON line at a time: ``ready`` (with the disk and the bytes of a
part kept for a resume) or ``full`` (nothing written), then ``ok`` (the older replicas that
stay, the disk after the prune), ``short`` (the stream ended early: the part stays, for a
resume), ``corrupt`` (the part is gone), ``error`` with the errno of an OS error (the parts are
gone), or ``timeout`` when no input came for the idle timeout. The standard library only.
"""

import hashlib
import json
import os
import select
import sys

try:  # on the spare these are defined by replica_rules' source, run just before this file
    from console.reach.replica_rules import (
        blocks,
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
    try:
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


def write_data(part, size, have, h, idle):
    """The data from stdin into the part from ``have`` on, hashed as written, fsynced; the
    part's size at the end (short of ``size`` when the input ended early)."""
    _doing[0] = "write " + part
    fd = os.open(part, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        os.ftruncate(fd, have)
        os.lseek(fd, have, os.SEEK_SET)
        got = have
        block = bytes(_pending[: size - got])
        while True:
            h.update(block)
            write_all(fd, block)
            got += len(block)
            if got >= size:
                break
            wait_input(idle)
            block = os.read(0, min(BLOCK, size - got))
            if not block:
                break
        os.fsync(fd)
    finally:
        os.close(fd)
    return got


def publish(stem, manifest, folder):
    """Data into place, then the manifest (which makes the replica complete), then the folder."""
    _doing[0] = "rename " + stem + ".pt.part"
    os.rename(stem + ".pt.part", stem + ".pt")
    _doing[0] = "write " + stem + ".json.part"
    fd = os.open(stem + ".json.part", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        write_all(fd, manifest)
        os.fsync(fd)
    finally:
        os.close(fd)
    _doing[0] = "rename " + stem + ".json.part"
    os.rename(stem + ".json.part", stem + ".json")
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def prune_first(h, part):
    """Drop leftovers (but a part kept for a resume) and what this copy retires; the older
    complete replicas that stay, and the bytes of the kept part."""
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
    have = 0
    if h["resume"] and os.path.exists(part):
        have = os.stat(part).st_size
    return older, (have if have <= h["size"] else 0)


def receive(h, idle):
    folder, step, size = h["folder"], h["step"], h["size"]
    stem = os.path.join(folder, step_stem(step))
    part = stem + ".pt.part"
    older, have = prune_first(h, part)
    _doing[0] = "statvfs " + folder
    free, _total, block = d = disk(folder)
    manifest = h["manifest"].encode()
    need, reserve = room(size, len(manifest), block, h["floor"])
    if free + blocks(have, block) < need + reserve:  # a kept part holds some of it already
        say(full=True, disk=d, need=need, reserve=reserve)
        return 0
    hashed = hashlib.sha256()
    if have and not hash_part(part, have, hashed):
        have, hashed = 0, hashlib.sha256()
    say(ready=True, disk=d, have=have)
    try:
        got = write_data(part, size, have, hashed, idle)
    except OSError:
        rm(part)
        raise
    if got < size:
        say(short=got)
        return 3
    if hashed.hexdigest() != h["sha256"]:
        rm(part)
        say(corrupt=hashed.hexdigest())
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
