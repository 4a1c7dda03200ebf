"""The program that puts a host-to-host replica key in place on a host, and takes it away,
run there as ``python -I -S -c`` with one JSON order on stdin and one JSON answer on stdout.

On the spare, ``grant`` writes the receiving program (``program`` at ``program_path``) and
puts the key's line in the login's authorized_keys (``file``), replacing the line that
carries the same ``tag`` (its last field); ``revoke`` removes every line whose tag starts
with ``tag``. Other lines are kept byte for byte; the file is rewritten beside itself and
renamed over it under a lock, so sshd never reads half of it. On the source, ``place``
writes the private key and the known_hosts line (0600, in a 0700 folder) and ``forget``
removes that folder. The answer: ``ok`` (with ``removed``), or ``error`` with the errno.
The standard library only.
"""

import fcntl
import json
import os
import shutil
import sys
import tempfile


def say(**fields):
    os.write(1, (json.dumps(fields) + "\n").encode())


def write_atomic(path, data, mode):
    """``data`` at ``path`` through a temp file beside it, fsynced, renamed into place."""
    folder = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".hotspare-")
    try:
        os.fchmod(fd, mode)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
        os.close(fd)
        fd = -1
        os.rename(tmp, path)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        os.unlink(tmp)
        raise


def tag_of(line):
    fields = line.split()
    return fields[-1] if len(fields) >= 3 and not line.lstrip().startswith(b"#") else b""


def edit_keys(path, tag, line, exact):
    """Drop the lines tagged ``tag`` (or, not ``exact``, whose tag starts with it); append
    ``line`` when given. The number of lines dropped."""
    path = os.path.realpath(os.path.expanduser(path))
    folder = os.path.dirname(path)
    if line is None and not os.path.exists(path):
        return 0
    if not os.path.isdir(folder):
        os.makedirs(folder, mode=0o700)
    with open(path + ".hotspare-lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            with open(path, "rb") as f:
                old = f.read()
            mode = os.stat(path).st_mode & 0o7777
        except FileNotFoundError:
            old, mode = b"", 0o600
        tag = tag.encode()
        kept, dropped = [], 0
        for each in old.splitlines(keepends=True):
            mine = tag_of(each)
            if mine and (mine == tag if exact else mine.startswith(tag)):
                dropped += 1
            else:
                kept.append(each)
        if kept and not kept[-1].endswith(b"\n"):
            kept[-1] += b"\n"
        if line is not None:
            kept.append(line.encode() + b"\n")
        new = b"".join(kept)
        if new != old:
            write_atomic(path, new, mode)
    return dropped


def grant(order):
    path = order["program_path"]
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    program = order["program"].encode()
    try:
        with open(path, "rb") as f:
            same = f.read() == program
    except FileNotFoundError:
        same = False
    if not same:
        write_atomic(path, program, 0o600)
    edit_keys(order["file"], order["tag"], order["line"], exact=True)
    return 0


def place(order):
    folder = order["folder"]
    os.makedirs(folder, mode=0o700, exist_ok=True)
    os.chmod(folder, 0o700)
    for name, text in sorted(order["files"].items()):
        write_atomic(os.path.join(folder, name), text.encode(), 0o600)
    return 0


def forget(order):
    shutil.rmtree(order["folder"], ignore_errors=True)
    return 0


def main():
    order = json.loads(sys.stdin.readline())
    try:
        if order["op"] == "revoke":
            removed = edit_keys(order["file"], order["tag"], None, exact=False)
        else:
            removed = {"grant": grant, "place": place, "forget": forget}[order["op"]](order)
    except OSError as e:
        say(error=(e.strerror or str(e)) + ": " + str(e.filename or ""), errno=e.errno)
        return 1
    say(ok=True, removed=removed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
