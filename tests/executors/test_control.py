"""Lease arithmetic on the executor's own monotonic clock: a lease never outlives what the
console counted on, and a lapsed one is never revived."""

from __future__ import annotations

import time

from executors import clock
from executors.agent.control import Control


def test_a_lease_runs_from_its_anchor_not_from_receipt() -> None:
    c = Control(epoch=4, lease_s=10)
    assert c.renew(4, ttl_s=10, anchor=clock.now() - 7)  # a heartbeat 7 s old anchors it
    left = c.lease_left()
    assert left is not None
    assert left <= 10, "never longer than the original grant"


def test_an_anchor_in_the_future_is_taken_as_now() -> None:
    c = Control(epoch=4, lease_s=1)
    assert c.renew(4, ttl_s=5, anchor=clock.now() + 3600)
    left = c.lease_left()
    assert left is not None
    assert left <= 5


def test_a_renewal_delayed_past_its_end_is_refused() -> None:
    c = Control(epoch=4, lease_s=0.5)
    assert not c.renew(4, ttl_s=3, anchor=clock.now() - 5)
    left = c.lease_left()
    assert left is not None
    assert left <= 0.5


def test_a_lapsed_lease_is_not_revived() -> None:
    """An executor SIGSTOPped past its lease and then continued may find a renewal in its
    socket: the console already counted the lease as over, so it must stay over."""
    c = Control(epoch=2, lease_s=3, lease_anchor=clock.now() - 3.5)
    assert not c.lease_valid()
    assert not c.renew(2, ttl_s=30)
    assert not c.lease_valid()


def test_the_wall_clock_has_no_say(monkeypatch) -> None:
    c = Control(epoch=1, lease_s=5)
    monkeypatch.setattr(time, "time", lambda: 0.0)  # the wall clock stepped back 56 years
    assert c.lease_valid(margin_s=4)
    assert c.renew(1, ttl_s=5)


def test_a_lease_of_another_epoch_is_refused() -> None:
    c = Control(epoch=4, lease_s=5)
    assert not c.renew(3, ttl_s=60)
    assert not c.renew(5, ttl_s=60)
    left = c.lease_left()
    assert left is not None
    assert left <= 5


def test_a_late_shorter_renewal_never_shortens_a_lease() -> None:
    c = Control(epoch=1, lease_s=0.1)
    assert c.renew(1, ttl_s=20)
    assert c.renew(1, ttl_s=20, anchor=clock.now() - 15)
    left = c.lease_left()
    assert left is not None
    assert left > 15
