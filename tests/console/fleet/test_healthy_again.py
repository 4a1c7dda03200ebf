"""A host that was failing and is no longer is journalled healthy again, whichever source saw it.

Run C (a fresh-clone suite): a spare's FAIL (2 uncorrectable ECC errors, from the health
probe) was cleared by the Health samples of a warm standby readied there meanwhile, not by the
next probe; "job j: spare c is healthy again" was journalled and "c: healthy again" never was,
since only the probe's path wrote it. The evidence here is the journal file on disk.
"""

from __future__ import annotations

from pathlib import Path

from support.fleetbed import local_host, write_inventory

from console.fleet.hosts import Fleet
from console.inventory import load
from console.records.journal import Journal, Kind, read
from console.records.state_store import StateStore
from protocol.messages import GpuHealth, Health


def health(*, lost: bool = False, ecc: int = 0) -> Health:
    return Health(
        t=0,
        cpu_pct=1,
        mem_used_pct=1,
        mem_available_mb=1,
        disk_free_mb=50_000,
        disk_total_mb=100_000,
        gpu_status="ok",
        gpus=(GpuHealth(index=0, lost=lost, ecc_uncorrected=ecc),),
    )


def fleet(tmp_path: Path) -> tuple[Fleet, Path]:
    inv = load(
        write_inventory(
            tmp_path / "inventory.toml", hosts={"c": local_host(tmp_path / "c")}, jobs={}
        )
    )
    path = inv.state_dir / "journal.jsonl"
    return Fleet(inv, Journal(path), StateStore(inv.state_dir)), path


def said(path: Path) -> list[str]:
    return [e.msg for e in read(path) if e.kind is Kind.HEALTH]


def test_a_fail_cleared_by_an_executors_sample_is_journalled_healthy_again_once(
    tmp_path: Path,
) -> None:
    hosts, path = fleet(tmp_path)
    hosts.observe("c", health(ecc=2), every_s=0.5)  # the probe's sample
    hosts.changed.clear()
    hosts.observe("c", health())  # a standby's sample on c (the executors' heartbeat)
    hosts.observe("c", health())
    assert said(path) == ["c: FAIL GPU 0: 2 uncorrectable ECC errors", "c: healthy again"]
    assert hosts.changed.is_set(), "a job waiting for a host may take c"


def test_a_failed_probe_then_samples_each_failure_ended_is_one_healthy_again(
    tmp_path: Path,
) -> None:
    hosts, path = fleet(tmp_path)
    hosts.probe_failed("c", "health probe failed: exit 3")
    hosts.observe("c", health(), every_s=0.5)
    hosts.observe("c", health(lost=True))
    hosts.observe("c", health())
    assert said(path) == [
        "c: FAIL health probe failed: exit 3",
        "c: healthy again",
        "c: FAIL GPU 0 fell off the bus",
        "c: healthy again",
    ]
