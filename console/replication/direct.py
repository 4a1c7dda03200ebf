"""Host-to-host replica copies: the source host sends the checkpoint straight to the spare,
the console orchestrates and verifies, so a checkpoint of many GB never crosses its link.

For an ssh source and an ssh spare whose inventory names its ``authorized_keys``, the
console installs the pair's scoped key (``direct_keys``) once per console, then per copy
runs ``direct_sender`` on the source, which feeds the file over
``ssh -i KEY -o StrictHostKeyChecking=yes ...`` (to the spare's data_address and SSH port)
into the spare's forced receiver (``direct_receiver``: the same receiving program as the
relay, with the folder fixed) and passes its answers back (``direct_wire`` reads them):
``ready`` (the room checked), then ``ok`` once the data is verified by sha256 and size and
renamed into place, manifest last.

When the pair cannot do that (no ssh client on the source, the spare refused or out of the
source's reach, the key not installable) the copy goes through the console as before
(``replica.py``), and so do the pair's copies for ``RELAY_FOR_S``; the journal says why.
A folder checkpoint (DCP's) goes the same way, its files one after another, the manifest
naming them (the receiver checks they stay in the folder and add up). Local hosts always take
the relay. A copy that failed after the
spare answered is a failed copy, not a reason to relay: the receiver may still be finishing.
When a job ends its keys are removed from its spares and sources (``revoke``).
"""

from __future__ import annotations

import json
import math
import posixpath
import re
import shutil
from collections.abc import Callable
from pathlib import Path

from console import clock
from console.inventory import Inventory
from console.reach.transport.base import (
    Transport,
    TransportError,
)
from console.reach.transport.ssh import SshTransport
from console.records.journal import Journal, Kind
from console.replication import direct_sender
from console.replication import direct_wire as wire
from console.replication.direct_keys import (
    NotDirect,
    PairKey,
    installed,
    known_hosts_line,
    load_or_make,
    receiver_path,
    receiver_program,
    tag,
)
from console.replication.replica import Measured, Received, ReplicaPlan

RELAY_FOR_S = 600.0
"""How long a pair that could not copy host to host keeps to the relay before trying again."""
MIN_MB_PER_S = 5.0
"""The slowest host-to-host copy allowed to finish; it sizes the copy's overall deadline."""
SSH = "ssh"
"""The OpenSSH client the source runs."""
SENDER = Path(direct_sender.__file__).read_text()
_PLAIN = re.compile(r"[A-Za-z0-9._:-]+")
"""What a spare's address and login may hold to reach an ssh command line."""


class DirectReplication:
    """Given the inventory, the hosts' transports and the journal; ``copy`` returns None
    where the relay must take a copy."""

    def __init__(
        self, inv: Inventory, transport: Callable[[str], Transport], journal: Journal
    ) -> None:
        self._inv = inv
        self._transport = transport
        self._journal = journal
        self._state = inv.state_dir / "direct"
        self._relay_until: dict[tuple[str, str], float] = {}
        self._direct: set[tuple[str, str]] = set()
        """Pairs whose last copy went host to host (journalled once, when that starts)."""
        self._granted: dict[str, str] = {}
        """key id -> the authorized_keys line installed on its spare by this console."""
        self._placed: dict[str, str] = {}
        """key id -> the known_hosts line placed beside the key on its source."""
        self._seen: dict[str, tuple[str, str]] = {}
        """spare -> (known_hosts line, login) as the console's verified connection saw it."""

    def _eligible(self, source: str, spare: str) -> bool:
        hosts = self._inv.hosts
        return (
            hosts[spare].authorized_keys is not None
            and isinstance(self._transport(source), SshTransport)
            and isinstance(self._transport(spare), SshTransport)
        )

    async def copy(
        self,
        job: str,
        spare: str,
        source: str,
        path: str,
        plan: ReplicaPlan,
        measured: Measured,
    ) -> Received | None:
        """The checkpoint at ``path`` on ``source`` into the spare's replica folder, host to
        host; None when the relay must take it (journalled when the pair falls back)."""
        pair = (source, spare)
        if not self._eligible(source, spare):
            return None
        if clock.mono() < self._relay_until.get(pair, 0.0):
            return None
        plan.check()  # a folder's files that would leave it: refused here, as the relay does
        try:
            key = load_or_make(self._state, job, plan.folder, source, spare)
        except (OSError, ValueError) as e:
            self._fall_back(job, pair, f"no key for the pair: {e}")
            return None
        try:
            known, login = await self._grant(job, key, spare, plan)
            folder = await self._place(job, key, source, known)
            got = await self._send(source, spare, path, plan, folder, login, measured)
        except NotDirect as e:
            self._fall_back(job, pair, str(e), key)
            return None
        if pair not in self._direct:
            self._direct.add(pair)
            self._journal.record(
                Kind.ROUTE,
                f"{job}: replicas from {source} to {spare} go host to host",
                job=job,
                host=spare,
                data={"source": source, "spare": spare, "route": "direct"},
            )
        return got

    def _fall_back(
        self, job: str, pair: tuple[str, str], why: str, key: PairKey | None = None
    ) -> None:
        source, spare = pair
        self._relay_until[pair] = clock.mono() + RELAY_FOR_S
        self._direct.discard(pair)
        if key is not None:  # installed again when the pair is tried next
            self._granted.pop(key.key_id, None)
            self._placed.pop(key.key_id, None)
        self._seen.pop(spare, None)
        self._journal.record(
            Kind.ROUTE,
            f"{job}: replicas from {source} to {spare} go through the console for "
            f"{RELAY_FOR_S:.0f}s: {why}",
            job=job,
            host=spare,
            data={"source": source, "spare": spare, "route": "relay", "why": why},
        )

    # -- the key in place ------------------------------------------------------------------

    async def _grant(
        self, job: str, key: PairKey, spare: str, plan: ReplicaPlan
    ) -> tuple[str, str]:
        """The key's line in the spare's authorized_keys and its receiver beside it; the
        spare's host key line and login, as the console's own connection verified them."""
        t = self._ssh(spare)
        root = self._inv.host_root(spare)
        program = receiver_program()
        command = [
            self._inv.python(spare), "-I", "-S", receiver_path(root, program),
            f"{t.default_timeout:g}", plan.folder, str(plan.replicas_kept), str(plan.floor),
        ]  # fmt: skip
        line = key.line(command)
        if self._granted.get(key.key_id) == line and spare in self._seen:
            return self._seen[spare]
        order = {
            "op": "grant",
            "file": self._inv.hosts[spare].authorized_keys,
            "tag": tag(job, key.key_id),
            "line": line,
            "program": program,
            "program_path": receiver_path(root, program),
        }
        try:
            _, conn = await wire.ask(t, self._inv.python(spare), order, "install a replica key")
        except TransportError as e:
            raise NotDirect(f"the key could not be installed on {spare}: {e}") from None
        alias = f"hotspare-{spare}"
        login = conn.get_extra_info("username") or ""
        address = self._inv.data_address(spare)
        if not _PLAIN.fullmatch(login) or not _PLAIN.fullmatch(address):
            raise NotDirect(f"{spare}'s login {login!r} or address {address!r} is odd")
        self._seen[spare] = (known_hosts_line(alias, conn.get_server_host_key()), login)
        self._granted[key.key_id] = line
        return self._seen[spare]

    async def _place(self, job: str, key: PairKey, source: str, known: str) -> str:
        """The private key and the spare's host key on the source; the folder holding them."""
        folder = posixpath.join(self._inv.host_root(source), "direct", job, key.key_id)
        if self._placed.get(key.key_id) == known:
            return folder
        files = {"id": key.private, "known_hosts": known + "\n"}
        order = {"op": "place", "folder": folder, "files": files}
        try:
            await wire.ask(
                self._ssh(source), self._inv.python(source), order, "place a replica key"
            )
        except TransportError as e:
            raise NotDirect(f"the key could not be placed on {source}: {e}") from None
        self._placed[key.key_id] = known
        return folder

    def _ssh(self, host: str) -> SshTransport:
        t = self._transport(host)
        if not isinstance(t, SshTransport):
            raise NotDirect(f"{host} is not an ssh host")
        return t

    # -- the copy ----------------------------------------------------------------------------

    def _ssh_argv(self, spare: str, login: str) -> list[str]:
        """The source's ssh to the spare: the pair's key only, the spare's verified host key
        only, no agent, no forwarding, no config file, no prompt; bounded connect and
        keepalives. Paths are relative to the key's folder (the sender's cwd)."""
        t = self._ssh(spare)
        opts = {
            "IdentitiesOnly": "yes", "IdentityAgent": "none", "UserKnownHostsFile": "known_hosts",
            "GlobalKnownHostsFile": "/dev/null", "StrictHostKeyChecking": "yes",
            "HostKeyAlias": f"hotspare-{spare}", "CheckHostIP": "no", "UpdateHostKeys": "no",
            "BatchMode": "yes", "PasswordAuthentication": "no",
            "KbdInteractiveAuthentication": "no", "ClearAllForwardings": "yes",
            "ControlMaster": "no", "ControlPath": "none", "LogLevel": "ERROR",
            "ConnectTimeout": str(math.ceil(t.target.connect_timeout)),
            "ServerAliveInterval": str(math.ceil(t.target.keepalive_s)),
            "ServerAliveCountMax": "3",
        }  # fmt: skip
        argv = [SSH, "-F", "/dev/null", "-T", "-x", "-a", "-e", "none", "-i", "id"]
        for k, v in opts.items():
            argv += ["-o", f"{k}={v}"]
        argv += ["-c", ",".join(t.tuning.ciphers), "-p", str(t.target.port or 22)]
        return [*argv, "-l", login, "--", self._inv.data_address(spare)]

    async def _send(
        self,
        source: str,
        spare: str,
        path: str,
        plan: ReplicaPlan,
        folder: str,
        login: str,
        measured: Measured,
    ) -> Received:
        t = self._ssh(source)
        reach = t.default_timeout + self._ssh(spare).target.connect_timeout
        limit = reach + plan.size / (MIN_MB_PER_S * 1e6)
        what = f"send {path} to {spare}"
        header = {
            "step": plan.step,
            "size": plan.size,
            "sha256": plan.sha256,
            "manifest": plan.manifest.decode(),
            "resume": False,
        }
        order = {
            "files": plan.sources(path),
            "cwd": folder,
            "ssh": self._ssh_argv(spare, login),
            "header": header,
        }
        python = self._inv.python(source)
        argv = ["timeout", "-s", "KILL", str(math.ceil(limit) + 5), python, "-I", "-S", "-c"]
        async with t.process([*argv, SENDER], what, reach) as proc:
            with t.errors(what, reach):
                proc.stdin.write(json.dumps(order).encode() + b"\n")
            first = await wire.answer(t, proc, what, reach, before=True)
            wire.refused(source, spare, what, first)
            if not first.get("ready"):
                raise wire.failed(spare, what, first)
            measured(wire.disk(first["disk"]))
            done = await wire.answer(t, proc, what, limit, before=False)
        if not done.get("ok"):
            raise wire.failed(spare, what, done)
        if done.get("disk"):
            measured(wire.disk(done["disk"]))
        return Received([int(s) for s in done["older"]], 0, 1)

    # -- the end of a job ------------------------------------------------------------------

    def has_keys(self, job: str) -> bool:
        """Whether keys of ``job`` were installed (by this console or one before it)."""
        return bool(installed(self._state, job))

    async def revoke(self, job: str) -> None:
        """Take the job's keys away: their lines from its spares' authorized_keys, their
        private keys from its sources and from here. Best effort, journalled; what cannot be
        reached keeps its record here and is named in the journal."""
        records = installed(self._state, job)
        if not records:
            return
        failed: list[str] = []
        for host in sorted({r["spare"] for r in records} | {r["source"] for r in records}):
            spare = any(r["spare"] == host for r in records)
            try:
                await self._revoke_on(job, host, spare=spare)
            except (TransportError, NotDirect, KeyError) as e:
                failed.append(f"{host}: {e}")
        for r in records:
            self._granted.pop(r["id"], None)
            self._placed.pop(r["id"], None)
        if failed:
            msg = f"{job}: host-to-host replica keys not all removed ({'; '.join(failed)})"
        else:
            shutil.rmtree(self._state / job, ignore_errors=True)
            msg = f"{job}: host-to-host replica keys removed"
        self._journal.record(Kind.ROUTE, msg, job=job, data={"revoked": not failed})

    async def _revoke_on(self, job: str, host: str, *, spare: bool) -> None:
        t = self._ssh(host)
        python = self._inv.python(host)
        folder = posixpath.join(self._inv.host_root(host), "direct", job)
        await wire.ask(t, python, {"op": "forget", "folder": folder}, "remove replica keys")
        file = self._inv.hosts[host].authorized_keys
        if spare and file is not None:
            order = {"op": "revoke", "file": file, "tag": tag(job)}
            await wire.ask(t, python, order, "remove replica keys")
