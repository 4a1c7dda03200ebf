"""The election itself, on a real 3-member etcd: one leader, rising terms, a deposed leader's
write refused by etcd, a resignation handed over with no incident, a death with one.

Evidence is etcd's own keys (read back with a client of their own), not the leaders' account.
"""

from __future__ import annotations

import asyncio

import pytest
from support.etcdbed import EtcdCluster, etcd_cluster_fixture  # noqa: F401 - the fixture

from console.records.state_store import Unsaved
from console.service.etcd import Etcd
from console.service.leader import Leadership

PREFIX = "/hotspare-leader-test"


def leadership(cluster: EtcdCluster, me: str) -> Leadership:
    return Leadership(Etcd(cluster.endpoints), PREFIX, me, ttl_s=2.0)


async def test_one_leads_the_other_waits_and_a_dead_leaders_write_never_lands(
    etcd_cluster: EtcdCluster,
) -> None:
    first, second = leadership(etcd_cluster, "first"), leadership(etcd_cluster, "second")
    won = await asyncio.wait_for(first.campaign(lambda _: None), 30)
    assert won.state is None and won.took_over is None
    first.put(b'{"jobs": {}}')
    said: list[str] = []
    told = asyncio.Event()
    waiting = asyncio.create_task(second.campaign(lambda why: (said.append(why), told.set())))
    await asyncio.wait_for(told.wait(), 30)  # the standby tells who leads first
    assert said[0] == f"standing by: first leads (term {won.term})"
    assert not waiting.done()

    etcd = Etcd(etcd_cluster.endpoints)
    etcd.revoke(first.lease)  # its etcd lease gone, as when it dies (no resign mark)
    took = await asyncio.wait_for(waiting, 30)
    assert took.term > won.term
    assert took.state == b'{"jobs": {}}', "the state the leader before wrote"
    assert took.took_over is not None, "a death: the standby's jobs get an incident"

    with pytest.raises(Unsaved, match=r"deposed|not sure"):
        first.put(b'{"jobs": {"stale": {}}}')
    assert first.doubt() is not None
    second.put(b'{"jobs": {"new": {}}}')
    state, writer = etcd.get(f"{PREFIX}/state"), etcd.get(f"{PREFIX}/writer")
    assert state is not None and state.value == b'{"jobs": {"new": {}}}'
    assert writer is not None and writer.value == str(took.term).encode()


async def test_a_deposed_leader_that_still_believes_it_leads_is_refused_by_etcd(
    etcd_cluster: EtcdCluster,
) -> None:
    """Its own clock says it still leads (sure_until not passed), but the key is another's:
    the compare on the term fails and it learns it is deposed."""
    first, second = leadership(etcd_cluster, "first"), leadership(etcd_cluster, "second")
    won = await asyncio.wait_for(first.campaign(lambda _: None), 30)
    Etcd(etcd_cluster.endpoints).revoke(first.lease)
    took = await asyncio.wait_for(second.campaign(lambda _: None), 30)
    first.sure_until = float("inf")  # a clock step, a stall that hid the expiry
    assert first.doubt() is None
    with pytest.raises(Unsaved, match=f"term {won.term} is no longer the leader's"):
        first.put(b"{}")
    assert first.deposed is not None and first.doubt() is not None
    assert await asyncio.wait_for(first.hold(), 30) == first.deposed
    assert took.term > won.term
    assert Etcd(etcd_cluster.endpoints).get(f"{PREFIX}/writer") is None, "nothing it wrote landed"


async def test_a_resignation_hands_over_at_once_with_no_incident(
    etcd_cluster: EtcdCluster,
) -> None:
    first, second = leadership(etcd_cluster, "first"), leadership(etcd_cluster, "second")
    await asyncio.wait_for(first.campaign(lambda _: None), 30)
    first.put(b"{}")
    told = asyncio.Event()
    waiting = asyncio.create_task(second.campaign(lambda _: told.set()))
    await asyncio.wait_for(told.wait(), 30)
    await first.resign()
    took = await asyncio.wait_for(waiting, 1.0 + 0.5)  # no ttl to wait out: revoked
    assert took.took_over is None
