"""Operator state in state_dir: drains, cordons, where each job runs and under which epoch.

Written atomically (temp file, fsync, rename) on every change; a restarted console reads it
back to reattach. The inventory file itself is never rewritten.
"""

from __future__ import annotations

import os
from pathlib import Path

import msgspec


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
    finished_sha256: str | None = None
    finished_step: int | None = None
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


class HostRecord(msgspec.Struct, kw_only=True):
    cordoned: bool = False
    drained: bool = False
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


class StateStore:
    def __init__(self, state_dir: Path, *, read_only: bool = False) -> None:
        if not read_only:
            state_dir.mkdir(parents=True, exist_ok=True)
        self.path = state_dir / "state.json"
        self.read_only = read_only
        """A console watching another's state dir: it reads, and never writes."""
        self.state = self._load()

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

    def new_incident(self) -> int:
        n = self.state.next_incident
        self.state.next_incident += 1
        self.save()
        return n

    def save(self) -> None:
        if self.read_only:
            return
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        with open(tmp, "wb") as f:
            f.write(msgspec.json.format(msgspec.json.encode(self.state)))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
