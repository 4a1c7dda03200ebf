"""Operator state in state_dir: drains, cordons, where each job runs and under which epoch.

Written atomically (temp file, fsync, rename, fsync of the folder) on every change; a
restarted console reads it back to reattach. The inventory file itself is never rewritten.

A write that fails (a full disk, EIO) raises nothing where the state is only kept (a cordon,
a spare, a restart count): the state stays in memory, listeners are told once (the console's
alert), and the next save, or the console's retry, writes it all. What must be on disk
before an action leaves this machine (a lease's bound, with its epoch) is saved with
``persist``, which raises ``Unsaved``: the lease is then not granted (``console/supervise/lease.py``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import msgspec

from protocol.errors import HotspareError


class LeaseRecord(msgspec.Struct, kw_only=True):
    """The bound on the newest lease a console granted, written before the lease is sent, so
    the next console knows how long the executor may still be training."""

    host: str
    epoch: int
    until: float
    """The console's monotonic clock (CLOCK_BOOTTIME) past which that lease has surely ended,
    before ``clock_skew_s`` is added."""
    boot_id: str
    """The console machine's boot: ``until`` means nothing on another."""
    ttl_s: float


class JobRecord(msgspec.Struct, kw_only=True):
    host: str | None = None
    spares: list[str] = []
    epoch: int = 0
    restarts: int = 0
    crash_looped: list[str] = []
    """Hosts where ``restarts`` ran out since the run last checkpointed past a restart: a
    second one fails the job (``console.supervise.restart``)."""
    finished_sha256: str | None = None
    finished_step: int | None = None
    finished_warnings: list[str] = []
    """Why its finish was not clean (none: clean)."""
    stopped: bool = False
    """Stopped by an operator: a console started later leaves it stopped until started."""
    lease: LeaseRecord | None = None
    members: list[str] = []
    """A multi-host job: its hosts now, by node rank (spares that replaced a member included)."""
    committed: list[int] = []
    """A multi-host job: its newest committed steps (every member wrote and verified its shard),
    oldest first; only these are resumed from."""
    run_id: str = ""
    """The job's one training run (``HOTSPARE_RUN_ID``): made at its first start, then kept
    across restarts, failovers and consoles, and the same for every member of a group."""
    open_incidents: list[int] = []
    """The job's incidents not yet resolved or ended, oldest first. A standby that takes over
    carries the newest on: its detection is in the journal of the leader before it, on another
    machine, not in its own."""

    @property
    def finished(self) -> bool:
        """The job finished (its params digest may be empty: a finish that was not clean)."""
        return self.finished_step is not None or bool(self.finished_sha256)


class HostRecord(msgspec.Struct, kw_only=True):
    cordoned: bool = False
    drained: bool = False
    draining: bool = False
    """Drained (by an operator or a GPU FAIL) while a job still had to move off: a console
    started before the move was made finds it draining, and the move is made (it found the
    host up, and the job trained on there or restarted there, the drain lost)."""
    provisioned: bool = False
    """Made by the inventory's provisioner (counted against its ``max_hosts``)."""
    releasing: bool = False
    """A provisioned host chosen for release: out of use from then on, its release command
    run (again, by a console started meanwhile) until it is ``released``."""
    released: bool = False
    """A provisioned host given back (its release command ran); no longer in the inventory."""


class OperatorState(msgspec.Struct, kw_only=True):
    jobs: dict[str, JobRecord] = {}
    hosts: dict[str, HostRecord] = {}
    next_incident: int = 1


class Unsaved(HotspareError):
    """The state could not be written (a full disk, EIO); the message is one line."""

    permanent = False


Trouble = Callable[[str | None], None]
"""Told why saving fails when it starts failing, and None when it works again."""


class Authority(Protocol):
    """Where the state must be written before the local file, and who may act on it: the
    elected leader's etcd (``console/service/leader.py``). Without one, the file is all."""

    def put(self, data: bytes) -> None:
        """Written where the next leader reads it, or ``Unsaved`` (a deposed leader's write
        never lands)."""

    def doubt(self) -> str | None:
        """Why this controller may not act now (not sure it still leads); None: it may."""


class StateStore:
    def __init__(self, state_dir: Path, *, read_only: bool = False) -> None:
        if not read_only:
            state_dir.mkdir(parents=True, exist_ok=True)
        self.path = state_dir / "state.json"
        self.read_only = read_only
        """A console watching another's state dir: it reads, and never writes."""
        self.state = self._load()
        self.unsaved: str | None = None
        """Why the newest state is not on disk (the last save failed); None: it is."""
        self._trouble: list[Trouble] = []
        self.authority: Authority | None = None
        """Set on a leader of standby controllers: every persist goes there first."""

    def on_trouble(self, listener: Trouble) -> None:
        """``listener`` told once when saving starts failing (why), once when it works again."""
        self._trouble.append(listener)

    def reload(self) -> None:
        """Read the file again (a read-only console follows the console that writes it)."""
        self.state = self._load()

    def _load(self) -> OperatorState:
        try:
            return msgspec.json.decode(self.path.read_bytes(), type=OperatorState)
        except FileNotFoundError:
            return OperatorState()
        except (OSError, msgspec.DecodeError) as e:
            raise RuntimeError(
                f"{self.path}: unreadable operator state ({e}); move it aside to start fresh"
            ) from None

    def job(self, name: str) -> JobRecord:
        return self.state.jobs.setdefault(name, JobRecord())

    def host(self, name: str) -> HostRecord:
        return self.state.hosts.setdefault(name, HostRecord())

    def new_incident(self, job: str) -> int:
        """The next incident's number, open for ``job`` (saved)."""
        n = self.state.next_incident
        self.state.next_incident += 1
        self.job(job).open_incidents.append(n)
        self.save()
        return n

    def incident_open(self, job: str, n: int, is_open: bool) -> None:
        """Incident ``n`` of ``job`` open again (carried on), or closed (resolved, ended);
        saved when that changes anything."""
        rec = self.job(job)
        if is_open == (n in rec.open_incidents):
            return
        rec.open_incidents = (
            [*rec.open_incidents, n] if is_open else [i for i in rec.open_incidents if i != n]
        )
        self.save()

    def save(self) -> bool:
        """Write the state; True once it is on disk. A failure raises nothing (see the module):
        the state is kept in memory and written by the next save that works."""
        try:
            self.persist()
        except Unsaved:
            return False
        return True

    def persist(self) -> None:
        """Write the state and make it durable (the file, then its folder's entry), or raise
        Unsaved; the file on disk is then the one before, whole (a temp file is renamed over
        it only once complete)."""
        if self.read_only:
            return
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        data = msgspec.json.format(msgspec.json.encode(self.state))
        if self.authority is not None:
            try:
                self.authority.put(data)
            except Unsaved as e:
                self._tell(str(e))
                raise
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
            _fsync_folder(self.path.parent)
        except OSError as e:
            with contextlib.suppress(OSError):
                tmp.unlink()
            why = f"{self.path}: not saved: {e.strerror or e}"
            self._tell(why)
            raise Unsaved(why) from None
        self._tell(None)

    def vouch(self) -> None:
        """Raise ``Unsaved`` when this controller may not act now (its authority doubts it
        still leads): no lease is granted, even one within the bound already written."""
        if self.authority is not None and (why := self.authority.doubt()) is not None:
            raise Unsaved(why)

    def _tell(self, why: str | None) -> None:
        if (why is None) == (self.unsaved is None):
            return  # no change: told once when it starts failing, once when it works again
        self.unsaved = why
        for listener in self._trouble:
            listener(why)


def _fsync_folder(folder: Path) -> None:
    """A rename is durable only once its folder is: fsync the folder itself."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
