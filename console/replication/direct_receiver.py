"""The forced command of a host-to-host replica key: the one thing that key can run on a spare.

Its authorized_keys line fixes everything that names a place (``IDLE FOLDER KEPT FLOOR``
as arguments; ``direct.py`` writes it), so the client holding the key chooses nothing but
which checkpoint it sends: the header line on stdin may carry only step, size, sha256, the
manifest and resume, each checked here (a folder checkpoint's files are read from its
manifest, and the receiver checks they stay inside the folder and add up); then ``replica_receiver``'s own ``receive`` (its
source passed in as text, run in a namespace of its own) does the copy into that folder and
answers as it always does. A client that asked for a command (``id``, scp, sftp) is refused
before anything is read. The standard library only; written to the spare as a file, with a
last line that calls ``main``.
"""

import json
import os
import re
import sys

HEX64 = re.compile(r"[0-9a-f]{64}")
ASKED = frozenset({"step", "size", "sha256", "manifest", "resume"})
MAX_MANIFEST = 1 << 20
MAX_FILES = 100_000
"""The most files a folder checkpoint's manifest may list."""
MAX_STEP = 10**10 - 1
"""A replica's name holds ten digits of its step."""


def say(**fields):
    os.write(1, (json.dumps(fields) + "\n").encode())


def whole(value, low, high):
    return type(value) is int and low <= value <= high


def checked(asked, folder, kept, floor):
    """The receiver's header from what the client asked, and why not (None when sound)."""
    if not isinstance(asked, dict) or not set(asked) <= ASKED:
        return None, "the request may hold only " + ", ".join(sorted(ASKED))
    step, size, sha256 = asked.get("step"), asked.get("size"), asked.get("sha256")
    manifest, resume = asked.get("manifest"), asked.get("resume", False)
    if not whole(step, 0, MAX_STEP) or not whole(size, 0, 1 << 50):
        return None, "step and size must be whole numbers in range"
    if not isinstance(sha256, str) or not HEX64.fullmatch(sha256):
        return None, "sha256 must be 64 hex digits"
    if type(resume) is not bool:
        return None, "resume must be true or false"
    if not isinstance(manifest, str) or len(manifest) > MAX_MANIFEST:
        return None, "the manifest must be text of at most 1 MiB"
    try:
        m = json.loads(manifest)
    except ValueError:
        return None, "the manifest is not JSON"
    if not isinstance(m, dict) or (m.get("step"), m.get("size"), m.get("sha256")) != (
        step,
        size,
        sha256,
    ):
        return None, "the manifest names another step, size or sha256"
    files = m.get("files")
    if files is not None:
        files = folder_files(files)
        if files is None:
            return None, "the manifest's files must each be a path, a size and a sha256"
    header = {
        "folder": folder,
        "step": step,
        "size": size,
        "sha256": sha256,
        "manifest": manifest,
        "kept": kept,
        "floor": floor,
        "resume": resume,
        "files": files,
    }
    return header, None


def folder_files(files):
    """A folder checkpoint's files as the receiver takes them ([path, size, sha256] each), from
    its manifest's list; None when that list is not one. Whether the paths stay inside the
    folder and add up to the manifest is the receiver's own check (``check_files``), made
    before it writes anything."""
    if not isinstance(files, list) or not files or len(files) > MAX_FILES:
        return None
    out = []
    for f in files:
        if not isinstance(f, dict) or set(f) != {"path", "size", "sha256"}:
            return None
        path, size, digest = f["path"], f["size"], f["sha256"]
        if not isinstance(path, str) or not whole(size, 0, 1 << 50):
            return None
        if not isinstance(digest, str) or not HEX64.fullmatch(digest):
            return None
        out.append([path, size, digest])
    return out


def main(receiver):
    if "SSH_ORIGINAL_COMMAND" in os.environ:
        say(error="this key only receives replicas; it runs no command", errno=None)
        return 2
    try:
        idle, folder = float(sys.argv[1]), sys.argv[2]
        kept, floor = int(sys.argv[3]), int(sys.argv[4])
    except (IndexError, ValueError):
        say(error="usage: IDLE FOLDER KEPT FLOOR", errno=None)
        return 2
    ns = {"__name__": "hotspare_replica_receiver"}
    exec(compile(receiver, "replica_receiver", "exec"), ns)
    try:
        asked = ns["read_header"](idle)
    except ValueError:
        say(error="the request is not one line of JSON", errno=None)
        return 2
    header, why = checked(asked, folder, kept, floor)
    if why is not None:
        say(error=why, errno=None, what="check the request")
        return 2
    try:
        return ns["receive"](header, idle)
    except OSError as e:
        say(error=e.strerror or str(e), errno=e.errno, what=ns["_doing"][0])
        return 1
