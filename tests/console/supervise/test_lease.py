"""The console's side of a lease: its bound is written before the lease leaves, a new console
reads it back, and the wall clock has no say in any of it."""

from __future__ import annotations

import time
from pathlib import Path

import msgspec
import pytest

from console import clock
from console.fleet.detect import ClockPace
from console.records.state_store import JobRecord, LeaseRecord, StateStore
from console.supervise.lease import PERSIST_AHEAD, JobLease, NoAnchor


class _Link:
    def __init__(self, anchor: tuple[float, float] | None) -> None:
        self.anchor = anchor


def _on_disk(path: Path) -> JobRecord:
    raw = msgspec.json.decode(path.read_bytes())
    return msgspec.convert(raw["jobs"]["j"], JobRecord)


def test_the_bound_is_on_disk_before_the_lease_is_handed_out(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    rec = store.job("j")
    rec.epoch = 3
    lease = JobLease(rec, store.save, ttl_s=10, skew_s=0.5)
    arrived = clock.mono() - 2.0  # the anchoring heartbeat arrived 2 s ago
    msg = lease.renewal(_Link((1234.5, arrived)), "a", 3)  # type: ignore[arg-type]
    assert msg.anchor == 1234.5, "anchored to the executor's own clock reading"
    saved = _on_disk(store.path).lease
    assert saved is not None
    assert (saved.host, saved.epoch, saved.ttl_s) == ("a", 3, 10)
    assert lease.until == pytest.approx(arrived + 10), "from the heartbeat's arrival, not the send"
    assert saved.until == pytest.approx(lease.until + 10 * PERSIST_AHEAD), "persisted ahead"
    assert saved.boot_id == clock.boot_id()


def test_renewals_at_every_reading_write_the_bound_ahead_and_seldom(tmp_path: Path) -> None:
    """A renewal per heartbeat must not mean a state write per heartbeat (each one an fsync in
    the console's loop), and the bound on disk is never before the newest lease's end."""
    store = StateStore(tmp_path)
    writes = []

    def save() -> None:
        store.save()
        writes.append(_on_disk(store.path).lease)

    rec = store.job("j")
    rec.epoch = 1
    lease = JobLease(rec, save, ttl_s=3, skew_s=0.2)
    t0 = clock.mono()
    for i in range(24):  # 6 s of heartbeats every 0.25 s, a renewal on each
        lease.renewal(_Link((100.0 + i / 4, t0 + i / 4)), "a", 1)  # type: ignore[arg-type]
        saved = writes[-1]
        assert saved is not None and saved.until >= lease.until, "the bound on disk covers it"
    assert lease.until == pytest.approx(t0 + 23 / 4 + 3)
    # one write per third of a lease at most (6 s of leases of 3 s), not one per renewal
    assert 2 <= len(writes) <= 1 + 6 / (3 * PERSIST_AHEAD), f"{len(writes)} writes for 24 grants"


def test_no_clock_reading_no_lease(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    lease = JobLease(store.job("j"), store.save, ttl_s=10, skew_s=0.5)
    with pytest.raises(NoAnchor):
        lease.renewal(_Link(None), "a", 1)  # type: ignore[arg-type]
    assert not store.path.exists(), "nothing granted, nothing written"


def test_a_new_console_waits_out_the_bound_the_last_one_wrote(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    rec = store.job("j")
    rec.epoch = 2
    JobLease(rec, store.save, ttl_s=20, skew_s=0.5).renewal(
        _Link((5.0, clock.mono())),  # type: ignore[arg-type]
        "a",
        2,
    )
    again = StateStore(tmp_path)  # the next console
    lease = JobLease(again.job("j"), again.save, ttl_s=20, skew_s=0.5)
    lease.restore()
    written = again.job("j").lease
    assert written is not None
    assert lease.until == written.until, "the bound as written (ahead of the lease), not less"
    assert 19.0 < lease.left() <= 20.5 + 20 * PERSIST_AHEAD
    assert not lease.ended()


def test_a_bound_from_another_boot_is_waited_in_full(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    rec = store.job("j")
    rec.epoch = 2
    rec.lease = LeaseRecord(host="a", epoch=2, until=1.0, boot_id="another boot", ttl_s=15)
    lease = JobLease(rec, store.save, ttl_s=10, skew_s=0.5)
    lease.restore()
    assert 15.0 < lease.left() <= 15.5, "its own ttl, from now"


def test_an_epoch_with_no_recorded_lease_is_waited_in_full(tmp_path: Path) -> None:
    """A state file from before leases were persisted: assume one was just granted."""
    store = StateStore(tmp_path)
    rec = store.job("j")
    rec.epoch = 4
    lease = JobLease(rec, store.save, ttl_s=10, skew_s=0.5)
    lease.restore()
    assert 10.0 < lease.left() <= 10.5
    fresh = JobLease(store.job("k"), store.save, ttl_s=10, skew_s=0.5)
    fresh.restore()
    assert fresh.ended(), "a job never started has no lease to wait out"


def test_stepping_the_wall_clock_moves_no_lease(tmp_path: Path, monkeypatch) -> None:
    store = StateStore(tmp_path)
    lease = JobLease(store.job("j"), store.save, ttl_s=10, skew_s=0.5)
    lease.renewal(_Link((5.0, clock.mono())), "a", 1)  # type: ignore[arg-type]
    before = lease.left()
    hook = tmp_path / "offset"
    hook.write_text("-86400")
    monkeypatch.setenv(clock.OFFSET_HOOK, str(hook))
    assert clock.wall() < time.time() - 86000, "the hook stepped the console's wall clock"
    assert lease.left() == pytest.approx(before, abs=0.5)
    assert not lease.ended()


def test_clock_pace_reports_drift_between_windows_not_message_delay() -> None:
    pace = ClockPace(window_s=10)
    drifts = []
    for i in range(40):  # 40 s of heartbeats at 1 Hz, each delayed 0-0.3 s, clocks in step
        t = float(i)
        d = pace.sample(executor_clock=1000 + t, arrived=t + (0.3 if i % 3 else 0.0))
        if d is not None:
            drifts.append(d)
    assert drifts and all(abs(d) < 0.01 for d in drifts), drifts
    slow = ClockPace(window_s=10)
    drifts = []
    for i in range(40):  # the executor's clock runs 10 % slow
        d = slow.sample(executor_clock=1000 + 0.9 * i, arrived=float(i))
        if d is not None:
            drifts.append(d)
    assert drifts and all(d == pytest.approx(1.0, abs=0.11) for d in drifts), drifts
