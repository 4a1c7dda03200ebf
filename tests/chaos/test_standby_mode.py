"""The chaos harness's standby mode (``scripts/chaos --standby``): what it draws, how a
leader's kill is matched to the incidents the standby opens, and an etcd member brought back."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

from support.etcdbed import EtcdCluster

from chaos import invariants as inv
from chaos.faults import Injected
from chaos.runner import draw
from chaos.schedule import CONSOLE_KINDS, STANDBY_KINDS
from console.records.journal import Event, Kind
from console.service.etcd import Etcd


def test_standby_mode_draws_its_own_faults_and_not_the_single_controllers() -> None:
    single = [k for s in range(40) for k in draw(random.Random(s), 8)]
    standby = [k for s in range(40) for k in draw(random.Random(s), 8, standby=True)]
    assert not STANDBY_KINDS & set(single), "no etcd without --standby"
    assert set(standby) >= STANDBY_KINDS
    assert not (CONSOLE_KINDS | {"wall_clock_step"}) & set(standby)
    # the default draw is what it was before standby mode existed (seeds reproduce)
    assert draw(random.Random(3), 8) == [
        "disk_full",
        "flap",
        "console_restart_partitioned",
        "oom",
        "host_kill",
        "sigkill",
        "console_restart",
        "disk_full",
    ]


def _failover(n: int, job: str, t: float) -> list[Event]:
    """The standby's start at ``t`` and the console_failover incident it opened for ``job``."""
    mark = {"phase": "detected", "class": "console_failover", "fault_at": t, "last_step": 40}
    return [
        Event(t=t, kind=Kind.INCIDENT, job=job, host="a", incident=n, data=mark),
        Event(t=t + 0.1, kind=Kind.INCIDENT, job=job, incident=n, data={"phase": "decided"}),
        Event(
            t=t + 0.2, kind=Kind.INCIDENT, job=job, incident=n, data={"phase": "loaded", "step": 40}
        ),
        Event(t=t + 0.5, kind=Kind.INCIDENT, job=job, incident=n, data={"phase": "first_step"}),
    ]


def test_a_leaders_kill_is_matched_to_its_jobs_failover_and_explains_the_other_jobs() -> None:
    events = [
        Event(t=0.0, kind=Kind.CONSOLE, msg="console started (policy auto)"),
        Event(t=12.0, kind=Kind.CONSOLE, msg="console started (policy auto)"),
        *_failover(3, "j", 12.1),
        *_failover(4, "k", 12.1),
    ]
    report = "| 3 | j | a | console_failover |\n| 4 | k | a | console_failover |"
    kill = Injected("leader_kill", "j", "a", 10.0, ("console_failover",), recovered_at=13.0)
    matches, leftover, _ = inv.match_incidents(events, [kill], report)
    assert [(m.ok, m.incident.id if m.incident else None) for m in matches] == [(True, 3)]
    assert leftover == [], "k's console_failover is the same kill, seen by another job"
    # a console_restart incident is no leader's kill, and the kill has none of its class
    restart = [
        e
        if e.kind is not Kind.INCIDENT or e.data.get("phase") != "detected"
        else Event(
            t=e.t,
            kind=e.kind,
            job=e.job,
            host=e.host,
            incident=e.incident,
            data={**e.data, "class": "console_restart"},
        )
        for e in events
    ]
    matches, leftover, _ = inv.match_incidents(restart, [kill], report)
    assert [m.ok for m in matches] == [False] and len(leftover) == 2


def test_an_etcd_member_killed_and_restarted_rejoins_its_cluster(tmp_path: Path) -> None:
    assert shutil.which("etcd"), "etcd is needed (scripts/test installs etcd-server)"
    cluster = EtcdCluster(tmp_path)
    cluster.start()
    try:
        client = Etcd(cluster.endpoints)
        client.txn([], [])
        cluster.kill("m0")
        assert not cluster.alive("m0")
        cluster.kill("m1")  # two of three down: no quorum until m0 is back
        cluster.restart("m0")
        assert cluster.alive("m0")
        cluster.wait_writable(30)  # m0 and m2: a quorum again, so m0 rejoined
    finally:
        cluster.stop()
