"""Faults of standby controllers (``scripts/chaos --standby``): the leading controller
SIGKILLed, and an etcd member SIGKILLed.

A leader's death is recorded by a ``console_failover`` incident per job, opened by the standby
that takes over: it reattaches to the same executors within their lease, so nothing stops and
nothing moves (the harness's fencing checks hold it to that, as for every fault). An etcd
member's death, with the other two up, must cause nothing at all: a blip. Only one member is
down at a time (two would be a loss of quorum, where no lease is granted by design:
tests/console/supervise/test_standby.py proves that on its own).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from chaos.faults import Injected, Target

MEMBER_DOWN_S = (3.0, 12.0)
"""How long a killed etcd member stays down before it is started again (it rejoins)."""


def leader_kill(t: Target) -> Injected:
    fleet = t.fleet
    slot = fleet.leading_slot()
    if slot is None:
        return Injected("leader_kill", t.job, t.host, time.time(), (), note="no leader found")
    at = time.time()
    fleet.kill_leader(slot)
    return Injected(
        "leader_kill", t.job, t.host, at, ("console_failover",), note=f"the controller of {slot}"
    )


def etcd_member_kill(t: Target) -> Injected:
    etcd = t.fleet.etcd
    assert etcd is not None, "standby mode only"
    name = t.rng.choice([n for n in etcd.names if etcd.alive(n)])
    etcd.kill(name)
    down_s = t.rng.uniform(*MEMBER_DOWN_S)
    since = time.monotonic()
    return Injected(
        "etcd_member_kill",
        t.job,
        t.host,
        time.time(),
        (),
        heal=lambda: etcd.restart(name),
        heal_when=lambda: time.monotonic() - since >= down_s,
        note=f"member {name}, down {down_s:.1f} s",
    )


INJECTORS: dict[str, Callable[[Target], Injected]] = {
    "leader_kill": leader_kill,
    "etcd_member_kill": etcd_member_kill,
}
KINDS = tuple(INJECTORS)
