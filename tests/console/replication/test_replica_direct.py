"""Replicas copied host to host between sshd hosts with a job-scoped key, and the relay
through the console when the pair cannot. Evidence: the spare's folder, the bytes the
console read of the source's file, the journal, authorized_keys and what the key can run.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shlex
import stat
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import asyncssh
import msgspec
import pytest
from support import sshbed
from support.fleetbed import job_table, write_inventory
from support.replicabed import manifest_of, tree, write_folder

from console.controller import Controller
from console.inventory import load
from console.reach.deploy import replica_dir
from console.reach.transport.ssh import SshTransport
from console.records.journal import Event, Kind, read
from console.replication import direct
from console.replication.direct_keys import TAG, NotDirect, forced_command
from console.replication.direct_receiver import checked
from console.replication.replica_receiver import unsound
from console.replication.replicator import Source
from console.supervise.policy import Policy
from protocol.spec import CheckpointManifest

SIZE = 3_000_000


class Reads(SshTransport):
    """Counts the bytes the console reads of files on the host."""

    read = 0

    async def read_chunks(self, path: str, **kw: Any) -> AsyncIterator[bytes]:
        async for block in super().read_chunks(path, **kw):
            self.read += len(block)
            yield block


class Pair:
    """A console (its job never started) with sshd hosts ``a`` (the job's) and ``b`` (its
    spare), b's root a name no shell may see unquoted."""

    def __init__(self, tmp: Path, bed: sshbed.SshBed, **spare: Any) -> None:
        a, b = bed.host(), bed.host()
        self.bed, self.a, self.b = bed, a, b
        # under the bed's short folder: the hostile name still leaves room for a job's socket
        root = bed.folder / 'b root, it\'s "quoted" $(touch pwned) `touch pwned`'
        spare = {"authorized_keys": str(bed.authorized_keys), "root": str(root), **spare}
        self.inv = write_inventory(
            tmp / "inventory.toml",
            hosts={"a": a.inventory_table("r1"), "b": b.inventory_table("r1", **spare)},
            jobs={"j": {"host": "a", "spares": ["b"], **job_table()}},
            min_free_disk_gb=0.0,
        )
        self.ctl = Controller(load(self.inv), Policy.AUTO)
        t = self.ctl.fleet.hosts["a"].transport
        assert isinstance(t, SshTransport)
        self.src = Reads(t.target, t.tuning)
        self.ctl.fleet.hosts["a"].transport = self.src
        self.folder = Path(replica_dir(str(root), "j"))

    def source(self, step: int) -> Source:
        data = os.urandom(SIZE)
        path = self.a.root / "jobs" / "j" / "checkpoints" / f"step-{step:010d}.pt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        m = CheckpointManifest(
            job="j", step=step, file=path.name, size=SIZE, sha256=hashlib.sha256(data).hexdigest(),
            epoch=1, spec_hash="x", code_version="x", created_at=time.time(),
        )  # fmt: skip
        return Source("a", str(path), m)

    async def copy(self, step: int) -> bool:
        return await self.ctl.replicator.copy("j", "b", self.source(step))

    def folder_source(self, step: int, files: dict[str, bytes]) -> Source:
        """A folder checkpoint (DCP's layout: a metadata file and each rank's shards) on a."""
        path = self.a.root / "jobs" / "j" / "checkpoints" / f"step-{step:010d}.pt"
        return Source("a", str(path), manifest_of(step, write_folder(path, files)))

    def holds(self, *steps: int) -> None:
        want = sorted(f"step-{s:010d}.{ext}" for s in steps for ext in ("json", "pt"))
        assert sorted(os.listdir(self.folder)) == want
        for s in steps:
            name = f"step-{s:010d}.pt"
            data = (self.folder / name).read_bytes()
            assert data == (self.a.root / "jobs" / "j" / "checkpoints" / name).read_bytes()
            m = msgspec.json.decode((self.folder / f"step-{s:010d}.json").read_bytes())
            assert (m["step"], m["sha256"]) == (s, hashlib.sha256(data).hexdigest())

    def events(self, kind: Kind) -> list[Event]:
        return [e for e in read(self.ctl.journal.path) if e.kind is kind]

    def key_lines(self) -> list[str]:
        return [ln for ln in self.bed.authorized_keys.read_text().splitlines() if TAG in ln]

    def console_key(self) -> Path:
        (key,) = [p for p in (self.ctl.inv.state_dir / "direct" / "j").iterdir() if not p.suffix]
        return key

    def key_options(self) -> list[str]:
        """OpenSSH client options that log in with the job's key alone."""
        opts = self.bed.ssh_options()
        opts[opts.index(str(self.bed.client_key))] = str(self.console_key())
        return opts

    def ssh_with_key(self, *command: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
        argv = ["ssh", *self.key_options(), "-p", str(self.b.port), "-T", "-l", "root"]
        return run([*argv, self.b.address, *command], stdin)


def run(argv: list[str], stdin: bytes) -> subprocess.CompletedProcess[bytes]:
    """An OpenSSH client, from this machine (a second or so: the test's loop may wait)."""
    return subprocess.run(argv, input=stdin, capture_output=True, timeout=30, check=False)


@pytest.fixture
def bed() -> Iterator[sshbed.SshBed]:
    with sshbed.ssh_bed() as b:
        yield b


@pytest.fixture
async def pair(tmp_path: Path, bed: sshbed.SshBed) -> AsyncIterator[Pair]:
    p = Pair(tmp_path, bed)
    try:
        yield p
    finally:
        await p.ctl.close()
    assert not any(tmp_path.rglob("pwned")) and not Path("pwned").exists()
    assert not any(bed.folder.rglob("pwned"))


async def test_a_replica_goes_host_to_host_and_its_key_goes_with_the_job(pair: Pair) -> None:
    assert await pair.copy(100)
    assert await pair.copy(200)
    pair.holds(100, 200)
    assert pair.src.read == 0, "the checkpoint's bytes crossed the console"
    oks = [e.data for e in pair.events(Kind.REPLICA)]
    assert [(d["ok"], d["route"]) for d in oks] == [(True, "direct"), (True, "direct")]
    (route,) = pair.events(Kind.ROUTE)
    assert route.data["route"] == "direct"
    (line,) = pair.key_lines()
    key = pair.console_key()
    assert line.startswith('restrict,command="') and line.endswith(":" + key.name)
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    (src_key,) = (pair.a.root / "direct" / "j").glob("*/id")
    assert stat.S_IMODE(src_key.stat().st_mode) == 0o600
    assert stat.S_IMODE(src_key.parent.stat().st_mode) == 0o700
    public = [asyncssh.read_private_key(str(k)).export_public_key() for k in (src_key, key)]
    assert public[0] == public[1] and public[0].split()[1].decode() in line
    assert pair.bed.client_public in pair.bed.authorized_keys.read_text()

    async def ended() -> None:  # the job's supervisor, its job over at once
        pass

    pair.ctl.jobs["j"].run = ended  # type: ignore[method-assign]
    await asyncio.wait_for(pair.ctl.run(), 60)
    assert pair.key_lines() == [] and not (pair.a.root / "direct" / "j").exists()
    assert not (pair.ctl.inv.state_dir / "direct" / "j").exists()
    assert pair.bed.client_public in pair.bed.authorized_keys.read_text()
    assert pair.events(Kind.ROUTE)[-1].data["revoked"]


async def test_the_key_runs_only_the_receiver_into_its_folder(pair: Pair, tmp_path: Path) -> None:
    assert await pair.copy(100)
    before = sorted(p for p in pair.b.root.parent.rglob("*") if "step-" not in p.name)
    asked = pair.ssh_with_key("id")
    assert b"uid=" not in asked.stdout and asked.returncode != 0
    assert "runs no command" in json.loads(asked.stdout)["error"]
    elsewhere = tmp_path / "elsewhere"
    for request in (
        {"folder": str(elsewhere), "step": 7, "size": 1, "sha256": "0" * 64, "manifest": "{}"},
        {"step": 7, "size": 1, "sha256": "0" * 64, "manifest": '{"step": 8}'},
        {"step": "../../x", "size": 1, "sha256": "0" * 64, "manifest": "{}"},
    ):
        got = pair.ssh_with_key(stdin=json.dumps(request).encode() + b"\n")
        assert "error" in json.loads(got.stdout.splitlines()[0]), got
    m = json.dumps({"step": 7, "size": 1, "sha256": "0" * 64})
    got = pair.ssh_with_key(stdin=json.dumps(json.loads(m) | {"manifest": m}).encode() + b"\nx")
    assert [next(iter(json.loads(ln))) for ln in got.stdout.splitlines()] == ["ready", "corrupt"]
    sftp = ["sftp", *pair.key_options(), "-P", str(pair.b.port), f"root@{pair.b.address}"]
    assert run(sftp, b"ls\n").returncode != 0
    assert not elsewhere.exists()
    after = sorted(p for p in pair.b.root.parent.rglob("*") if "step-" not in p.name)
    assert after == before
    pair.holds(100)


async def test_a_folder_checkpoint_goes_host_to_host_whole_and_verified(pair: Pair) -> None:
    files = {".metadata": os.urandom(5_000), "__0_0.distcp": os.urandom(SIZE)}
    files |= {"__1_0.distcp": os.urandom(SIZE), "extra/state.json": b"{}"}
    assert await pair.ctl.replicator.copy("j", "b", pair.folder_source(100, files))
    assert pair.src.read == 0, "the folder's bytes crossed the console"
    (ok,) = [e.data for e in pair.events(Kind.REPLICA)]
    assert (ok["ok"], ok["route"], ok["bytes"]) == (True, "direct", sum(map(len, files.values())))
    assert tree(pair.folder / "step-0000000100.pt") == tree(
        pair.a.root / "jobs" / "j" / "checkpoints" / "step-0000000100.pt"
    )
    assert sorted(os.listdir(pair.folder)) == ["step-0000000100.json", "step-0000000100.pt"]
    m = msgspec.json.decode((pair.folder / "step-0000000100.json").read_bytes())
    assert sorted(f["path"] for f in m["files"]) == sorted(files)


async def test_a_folder_whose_file_changed_on_the_source_is_refused_and_nothing_is_left(
    pair: Pair,
) -> None:
    files = {".metadata": os.urandom(5_000), "__0_0.distcp": os.urandom(SIZE)}
    src = pair.folder_source(100, files)
    shard = Path(src.path) / "__0_0.distcp"
    shard.write_bytes(b"x" + shard.read_bytes()[1:])  # same size, another sha256
    assert not await pair.ctl.replicator.copy("j", "b", src)
    (failed,) = [e.data for e in pair.events(Kind.REPLICA)]
    assert failed["ok"] is False
    assert not pair.folder.exists() or os.listdir(pair.folder) == [], "nothing left"
    assert pair.src.read == 0, "not relayed instead: the copy failed, it was not refused"


@pytest.mark.parametrize("cut", ["address", "no_ssh", "keys_file"])
async def test_a_pair_that_cannot_reach_falls_back_to_the_relay(
    tmp_path: Path, bed: sshbed.SshBed, cut: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    spare: dict[str, Any] = {}
    if cut == "address":
        spare["data_address"] = "127.0.0.254"  # nothing listens there: the source is refused
    elif cut == "keys_file":
        (tmp_path / "a-file").write_text("")
        spare["authorized_keys"] = str(tmp_path / "a-file" / "authorized_keys")
    else:
        monkeypatch.setattr(direct, "SSH", "ssh-that-is-not-there")
    p = Pair(tmp_path, bed, **spare)
    try:
        assert await p.copy(100)
        assert await p.copy(200)
        p.holds(100, 200)
        assert p.src.read == 2 * SIZE
        assert [e.data["route"] for e in p.events(Kind.REPLICA)] == ["relay", "relay"]
        (route,) = p.events(Kind.ROUTE)  # one try, then the relay for a while
        assert route.data["route"] == "relay"
        why = {
            "address": "refused",
            "no_ssh": "no ssh client",
            "keys_file": "could not be installed",
        }[cut]
        assert why in route.data["why"], route.data["why"]
    finally:
        await p.ctl.close()


def test_the_forced_receiver_reads_a_folders_files_from_its_manifest_and_its_receiver_checks_them() -> (
    None
):
    folder = [{"path": "../x", "size": 1, "sha256": "a" * 64}]
    m = json.dumps({"step": 7, "size": 1, "sha256": "a" * 64, "files": folder})
    header, why = checked({"step": 7, "size": 1, "sha256": "a" * 64, "manifest": m}, "/r", 2, 0)
    assert why is None and header is not None and header["files"] == [["../x", 1, "a" * 64]]
    assert "'../x'" in str(unsound(header)), "refused by the receiver before it writes"
    for files in ([], [["x", 1, "a" * 64]], [{"path": "x", "size": -1, "sha256": "a" * 64}],
                  [{"path": "x", "size": 1, "sha256": "a" * 64, "mode": 4}], "x"):  # fmt: skip
        bad = json.dumps({"step": 7, "size": 1, "sha256": "a" * 64, "files": files})
        asked = {"step": 7, "size": 1, "sha256": "a" * 64, "manifest": bad}
        assert checked(asked, "/r", 2, 0)[0] is None, files


def test_the_forced_receiver_takes_nothing_that_names_a_place() -> None:
    m = json.dumps({"step": 7, "size": 1, "sha256": "a" * 64})
    good = {"step": 7, "size": 1, "sha256": "a" * 64, "manifest": m}
    header, why = checked(good, "/r/replicas/j", 2, 0)
    assert why is None and header is not None
    assert (header["folder"], header["kept"], header["resume"]) == ("/r/replicas/j", 2, False)
    for bad in (
        {**good, "folder": "/etc"}, {**good, "kept": 0}, {**good, "step": True},
        {**good, "step": -1}, {**good, "sha256": "A" * 64}, {**good, "resume": 1},
        {**good, "manifest": m.replace("7", "8")}, {"step": 7, "size": 1, "sha256": "a" * 64},
        {**good, "manifest": json.dumps({**json.loads(m), "files": [["x", 1, "a" * 64]]})},
    ):  # fmt: skip
        assert checked(bad, "/r/replicas/j", 2, 0)[0] is None, bad
    argv = ["python3", '/r/it\'s "x" $(y)']
    line = forced_command(argv)  # sshd reads \" as ", then the shell splits what it got
    assert '"' not in line.replace('\\"', "") and shlex.split(line.replace('\\"', '"')) == argv
    with pytest.raises(NotDirect):
        forced_command(["python3", "/r/a\\b"])
