"""A job's supervisor built from ``JobServices`` alone, with stand-ins for the controller's
decisions that record every call: decision tests of what a supervisor does with what its
executors say, with no process started."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from console.fleet.detect import DetectionSettings
from console.fleet.hosts import Fleet
from console.inventory import load
from console.records.incidents import IncidentLog
from console.records.journal import Journal
from console.records.state_store import StateStore
from console.replication.replicator import Replicator
from console.states import JobState
from console.supervise.member import Member
from console.supervise.outcome import Outcome
from console.supervise.policy import Policy
from console.supervise.services import JobServices
from console.supervise.supervisor import Supervisor
from protocol.messages import ExecutorMessage
from support.fleetbed import job_table, local_host, write_inventory


class Calls:
    """Stand-ins for the controller's decisions that record every call."""

    def __init__(self) -> None:
        self.made: list[tuple[str, tuple[Any, ...]]] = []
        self.policy = Policy.MANUAL

    def __getattr__(self, name: str) -> Any:
        def call(*args: Any, **kw: Any) -> Any:
            self.made.append((name, args))

        return call


def services(tmp_path: Path, calls: Calls, more: dict[str, str] | None = None) -> JobServices:
    """Hosts a, b, c (region r1), and ``more`` (name -> region); job j on a with spare c, the
    group g on a and b with spare c."""
    hosts = {h: local_host(tmp_path / h) for h in "abc"}
    hosts |= {h: local_host(tmp_path / h, region=r) for h, r in (more or {}).items()}
    inv = load(
        write_inventory(
            tmp_path / "inventory.toml",
            hosts=hosts,
            jobs={
                "j": {"host": "a", "spares": ["c"], **job_table()},
                "g": {"hosts": ["a", "b"], "spares": ["c"], **job_table()},
            },
        )
    )
    journal = Journal(inv.state_dir / "journal.jsonl")
    store = StateStore(inv.state_dir)
    fleet = Fleet(inv, journal, store)
    incidents = IncidentLog(journal, store)
    c = inv.console
    return JobServices(
        inv=inv,
        fleet=fleet,
        journal=journal,
        store=store,
        incidents=incidents,
        replicator=Replicator(
            inv,
            transport=lambda h: fleet.hosts[h].transport,
            journal=journal,
            incidents=incidents,
            step_of=lambda job: None,
        ),
        detection=DetectionSettings(
            c.heartbeat_s, c.missed_heartbeats, c.suspect_after_s, c.lease_s, c.clock_skew_s
        ),
        read_only=False,
        console_id="test:1",
        term=0,
        executor_env={},
        policy=lambda: calls.policy,
        alert=calls.alert,
        alerted=lambda msg: False,
        reserved=lambda job: {},
        priorities=lambda: {},
        take_spare=calls.take_spare,
        need_host=calls.need_host,
        wait_for_hosts=calls.wait_for_hosts,
        on_progress=calls.on_progress,
    )


def running(svc: JobServices, kind: str, hosts: list[str], *, deployed: bool = True) -> Supervisor:
    """Job j on ``hosts[0]`` (kind "one host": a group of one) or the group g on ``hosts``
    (node ranks in order), running: as its supervisor sees it when its run ends
    (``deployed`` False: still deploying there)."""
    sup = supervisor(svc, kind, hosts)
    sup.live.machine.move(JobState.DEPLOYING)
    if deployed:
        sup.live.machine.move(JobState.RUNNING)
    return sup


def supervisor(svc: JobServices, kind: str, hosts: list[str]) -> Supervisor:
    """Job j on ``hosts[0]`` (kind "one host": a group of one) or the group g on ``hosts``,
    placed there at epoch 1 (its commits counting its members' shards), not yet deploying."""
    sup = Supervisor(svc, "j" if kind == "one host" else "g")
    sup._assign_members(hosts[:1] if kind == "one host" else hosts)
    sup.live.rec.epoch = 1
    sup.commits.new_epoch(1, len(sup.members))  # as an epoch's start does
    return sup


def say(sup: Supervisor, host: str, msg: ExecutorMessage) -> Outcome | None:
    """What the executor on ``host`` (one of ``sup``'s members) says, through the one
    dispatcher; the run's end if it says its run ended."""
    return sup._messages.on_message(Member(sup.members.index(host), host), msg)


async def recovered(sup: Supervisor, ends: list[Outcome], resume: int | None = None) -> object:
    """What ``sup``'s recovery returns for its run ending so (one end per member, the first
    the one that ended the run; a group of one's is the first; ``resume``: the step the epoch
    was told to resume from), within 10 s."""
    ends = ends[: len(sup.members)]
    members = [Member(r, h, exit=e) for r, (h, e) in enumerate(zip(sup.members, ends, strict=True))]
    run = SimpleNamespace(members=members, origin=lambda: members[0], resume=resume)
    return await asyncio.wait_for(sup._group_recovery.recover(run), 10)  # type: ignore[arg-type]
