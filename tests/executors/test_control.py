"""Lease arithmetic: a lease never outlives what the console counted on."""

from __future__ import annotations

import time

from executors.control import Control


def test_a_lease_runs_from_the_consoles_send_time_not_from_receipt() -> None:
    c = Control(epoch=4, lease_s=10)
    assert c.renew(4, ttl_s=10, sent_at=time.time() - 7)  # delayed 7 s on the way
    left = c.lease_left()
    assert left is not None
    assert left <= 10, "never longer than the original grant"


def test_a_renewal_delayed_past_its_end_is_refused() -> None:
    c = Control(epoch=4, lease_s=0.5)
    assert not c.renew(4, ttl_s=3, sent_at=time.time() - 5)
    left = c.lease_left()
    assert left is not None
    assert left <= 0.5


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
    assert c.renew(1, ttl_s=20, sent_at=time.time() - 15)
    left = c.lease_left()
    assert left is not None
    assert left > 15
