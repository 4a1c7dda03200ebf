"""The scoped credential of host-to-host replica copies: one key per (job's replica folder,
source, spare), able to run nothing but the replica receiver into that folder.

The private key lives in the console's state_dir (``direct/JOB/ID``, 0600) and, for the
copies, on the source host under its root (``direct/JOB/ID/id``, 0600, beside a known_hosts
holding the one spare host key the console itself verified, under an alias). The public key
goes in the spare login's authorized_keys as
``restrict,command="PYTHON -I -S RECEIVER IDLE FOLDER KEPT FLOOR" KEY hotspare-direct:JOB:ID``:
the folder and its rules are fixed there, never taken from the client. Everything that goes
into that line is shell-quoted, and a value that could not be written there safely
(a backslash, a control character) keeps the pair on the relay.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import shlex
from dataclasses import dataclass
from pathlib import Path

import asyncssh

from console.replication import direct_receiver
from console.replication.replica import PROGRAM
from protocol.errors import HotspareError

TAG = "hotspare-direct"


class NotDirect(HotspareError):
    """This pair cannot copy host to host now; ``str()`` says why (the relay takes the copy)."""

    permanent = True


def receiver_program() -> str:
    """The forced command's file: the checks, then the receiver's own source, run by them."""
    return (
        Path(direct_receiver.__file__).read_text()
        + f"\n\nif __name__ == '__main__':\n    sys.exit(main({PROGRAM!r}))\n"
    )


def receiver_path(root: str, program: str) -> str:
    """Named by its content, so a console of another version never runs an older one."""
    digest = hashlib.sha256(program.encode()).hexdigest()[:16]
    return posixpath.join(root, "direct", f"receiver-{digest}.py")


def tag(job: str, key_id: str = "") -> str:
    """The last field of a key's authorized_keys line: ``hotspare-direct:JOB:ID`` (the job's
    prefix, without an id)."""
    return f"{TAG}:{job}:{key_id}"


def forced_command(argv: list[str]) -> str:
    """``argv`` as the value of authorized_keys' ``command="..."`` (shell-quoted, then each
    double quote escaped: the only escape sshd reads there)."""
    for arg in argv:
        if "\\" in arg or not arg.isprintable():
            raise NotDirect(f"{arg!r} cannot be written into an authorized_keys line")
    return shlex.join(argv).replace('"', '\\"')


@dataclass(frozen=True)
class PairKey:
    """One (job folder, source, spare)'s key pair, as the console keeps it."""

    job: str
    key_id: str
    private: str
    """OpenSSH private key text: written to the console's state_dir and the source, never
    logged, never on a command line."""
    public: str
    """``ssh-ed25519 AAAA...``, no comment."""

    def line(self, command: list[str]) -> str:
        return f'restrict,command="{forced_command(command)}" {self.public} {tag(self.job, self.key_id)}'


def key_id(folder: str, source: str, spare: str) -> str:
    return hashlib.sha256(f"{folder}\0{source}\0{spare}".encode()).hexdigest()[:12]


def load_or_make(state: Path, job: str, folder: str, source: str, spare: str) -> PairKey:
    """The pair's key from ``state/JOB/ID`` (made there, 0600 in a 0700 folder, the first
    time), with ``ID.json`` saying where it was installed, for its removal."""
    kid = key_id(folder, source, spare)
    home = state / job
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(home, 0o700)
    path = home / kid
    if path.exists():
        key = asyncssh.read_private_key(str(path))
    else:
        key = asyncssh.generate_private_key("ssh-ed25519")
        _write_private(path, key.export_private_key("openssh"))
        where = {"source": source, "spare": spare, "folder": folder}
        (home / f"{kid}.json").write_text(json.dumps(where) + "\n")
    private = key.export_private_key("openssh").decode()
    public = " ".join(key.export_public_key("openssh").decode().split()[:2])
    return PairKey(job, kid, private, public)


def installed(state: Path, job: str) -> list[dict[str, str]]:
    """Where this job's keys were installed (id, source, spare, folder), as recorded."""
    found: list[dict[str, str]] = []
    for meta in sorted((state / job).glob("*.json")):
        try:
            found.append({**json.loads(meta.read_text()), "id": meta.stem})
        except (OSError, ValueError):
            continue
    return found


def _write_private(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def known_hosts_line(alias: str, key: object) -> str:
    """The spare's host key as the console's own verified connection saw it, under ``alias``."""
    if not isinstance(key, asyncssh.SSHKey):
        raise NotDirect("the spare's host key is not a plain key (a certificate or GSS)")
    return f"{alias} " + " ".join(key.export_public_key("openssh").decode().split()[:2])
