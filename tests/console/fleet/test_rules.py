"""The controller's pure rules: state tables, placement, detection, health severities, the journal."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.fleetbed import local_host, write_inventory

from console.fleet.detect import DetectionSettings, is_suspect
from console.fleet.health_rules import Severity, evaluate
from console.inventory import HealthThresholds, load
from console.records.journal import Journal, Kind, read
from console.spares.placement import choose_primary, choose_spares, rank
from console.states import (
    HOST_TRANSITIONS,
    JOB_TRANSITIONS,
    HostState,
    IllegalTransition,
    JobState,
    Machine,
)
from protocol.messages import GpuHealth, Health

S = DetectionSettings(
    heartbeat_s=1.0, missed_heartbeats=3, suspect_after_s=2.0, lease_s=9.0, clock_skew_s=0.5
)


def test_every_state_has_a_row_and_illegal_moves_raise() -> None:
    assert set(HOST_TRANSITIONS) == set(HostState)
    assert set(JOB_TRANSITIONS) == set(JobState)
    m = Machine(JobState.FINISHED, JOB_TRANSITIONS)
    with pytest.raises(IllegalTransition, match="finished -> running"):
        m.move(JobState.RUNNING)
    h = Machine(HostState.DOWN, HOST_TRANSITIONS)
    with pytest.raises(IllegalTransition):
        h.move(HostState.DRAINING)
    assert h.move(HostState.UP)
    assert not h.move(HostState.UP), "staying put is not a transition"


def test_suspect_needs_both_the_window_and_the_count() -> None:
    assert not is_suspect(now=2.5, last_seen=0.0, s=S), "window passed but only 2 heartbeats missed"
    assert not is_suspect(now=1.9, last_seen=0.0, s=DetectionSettings(0.1, 3, 2.0, 9, 0.5)), (
        "count but no window"
    )
    assert is_suspect(now=3.0, last_seen=0.0, s=S)


@pytest.fixture
def inv(tmp_path: Path):  # type: ignore[no-untyped-def]
    path = write_inventory(
        tmp_path / "inventory.toml",
        regions=("east", "west", "south"),
        hosts={
            "a": local_host(tmp_path / "a", region="east"),
            "b": local_host(tmp_path / "b", region="west", role="spare"),
            "c": local_host(tmp_path / "c", region="east", role="spare", priority=5),
            "d": local_host(tmp_path / "d", region="east", role="spare", priority=1),
            "e": local_host(tmp_path / "e", region="south", role="spare"),
        },
        jobs={
            "low": {"host": "a", "steps": 10, "priority": 0},
            "high": {"region": "east", "steps": 10, "priority": 9},
        },
    )
    return load(path)


def test_spares_prefer_the_same_region_then_region_order_then_host_priority(inv) -> None:  # type: ignore[no-untyped-def]
    assert rank(inv, "east", ["e", "b", "c", "d"]) == ["d", "c", "b", "e"]
    choice = choose_spares(
        inv, "low", "a", usable={"b", "c", "d", "e"}, reserved={}, priority={}, count=2
    )
    assert choice.spares == ["d", "c"]
    assert choice.taken == []


def test_a_reserved_spare_goes_only_to_a_higher_priority_job(inv) -> None:  # type: ignore[no-untyped-def]
    prio = {"low": 0, "high": 9}
    mine = choose_spares(inv, "low", "a", usable={"d", "e"}, reserved={"d": "high"}, priority=prio)
    assert mine.spares == ["e"], "a lower-priority job does not get high's spare"
    taken = choose_spares(inv, "high", "c", usable={"d", "e"}, reserved={"d": "low"}, priority=prio)
    assert taken.spares == ["d"]
    assert taken.taken == [("d", "low")], "taking it is reported"
    assert (
        choose_primary(inv, "high", usable={"b", "c", "d", "e"}, reserved={}, priority=prio) == "d"
    )


def gpu(**kw: object) -> GpuHealth:
    return GpuHealth(index=0, **kw)  # type: ignore[arg-type]


def health(*gpus: GpuHealth, disk_free_mb: float = 50_000) -> Health:
    return Health(
        t=0,
        cpu_pct=1,
        mem_used_pct=1,
        mem_available_mb=1,
        disk_free_mb=disk_free_mb,
        disk_total_mb=100_000,
        gpu_status="ok",
        gpus=tuple(gpus),
    )


@pytest.mark.parametrize(
    ("sample", "rules", "severity"),
    [
        (health(gpu(ecc_uncorrected=1)), {"ecc_dbe"}, Severity.FAIL),
        (health(gpu(remap_failure=True)), {"row_remap_failure"}, Severity.FAIL),
        (health(gpu(xids=(79,))), {"xid_79"}, Severity.FAIL),
        (health(gpu(xids=(13,))), set(), None),
        (health(gpu(lost=True)), {"gpu_lost"}, Severity.FAIL),
        (health(gpu(throttle=("hw_thermal", "sw_power_cap"))), {"throttle"}, Severity.WARN),
        (health(gpu(throttle=("sw_power_cap",))), set(), None),
        (health(gpu(temp_c=90)), {"temperature"}, Severity.WARN),
        (health(gpu(temp_c=70, ecc_corrected=50)), set(), None),
        (health(disk_free_mb=1000), {"disk"}, Severity.WARN),
    ],
)
def test_health_rules(sample: Health, rules: set[str], severity: Severity | None) -> None:
    found = evaluate(sample, None, HealthThresholds())
    assert {f.rule for f in found} == rules
    assert {f.severity for f in found} == ({severity} if severity else set())


def test_pcie_replays_are_a_rate_and_thresholds_come_from_the_inventory() -> None:
    t = HealthThresholds(pcie_replays_warn=10, temp_warn_c=60)
    assert evaluate(health(gpu(pcie_replays=500)), None, t) == [], "a counter alone says nothing"
    rates = evaluate(health(gpu(pcie_replays=520)), health(gpu(pcie_replays=500)), t)
    assert [f.rule for f in rates] == ["pcie_replays"]
    assert [f.rule for f in evaluate(health(gpu(temp_c=65)), None, t)] == ["temperature"]


def test_the_journal_skips_a_torn_last_line(tmp_path: Path) -> None:
    j = Journal(tmp_path / "journal.jsonl")
    j.record(Kind.ALERT, "one")
    j.record(Kind.ALERT, "two", host="a", data={"x": 1})
    j.close()
    with open(tmp_path / "journal.jsonl", "ab") as f:
        f.write(b'{"t": 1.0, "kind": "alert", "msg": "thr')  # the console died mid-write
    events = list(read(tmp_path / "journal.jsonl"))
    assert [e.msg for e in events] == ["one", "two"]
    assert events[1].host == "a"
    assert events[1].data == {"x": 1}
