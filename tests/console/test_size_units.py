"""One way to write a size everywhere: the formatter's rules, and the same free disk written
alike by ``hotspare check``, the console's Fleet view, its health finding and the executor's
health line (``74.1 GiB`` in check and ``74G`` in the console before)."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from support.fleetbed import local_host, write_inventory

from console.controller import Controller
from console.fleet.health_rules import evaluate
from console.inventory import HealthThresholds, load
from console.reach.check import render
from console.reach.preflight import Preflight
from console.supervise.policy import Policy
from console.ui.view import FLEET_COLUMNS, fleet_rows
from protocol.messages import Health
from protocol.units import size, size_mb, used_of

GIB = 2**30


@pytest.mark.parametrize(
    ("n", "shown"),
    [
        (0, "0 B"),
        (512, "512 B"),
        (1024, "1.0 KiB"),
        (980 * 1024, "980 KiB"),
        (12.3 * 2**20, "12 MiB"),
        (1023.9 * 2**20, "1.0 GiB"),
        (7.5 * GIB, "7.5 GiB"),
        (9.96 * GIB, "10 GiB"),
        (74.1 * GIB, "74 GiB"),
        (252 * GIB, "252 GiB"),
        (1.2 * 2**40, "1.2 TiB"),
    ],
)
def test_a_size_is_binary_units_with_a_space_and_a_decimal_only_below_ten(
    n: float, shown: str
) -> None:
    assert size(n) == shown


def test_a_part_of_a_whole_is_in_the_whole_s_unit() -> None:
    assert used_of(40 * GIB, 80 * GIB) == "40/80 GiB"
    assert used_of(0, 80 * GIB) == "0/80 GiB"
    assert used_of(3 * GIB, 8 * GIB) == "3.0/8.0 GiB"
    assert used_of(512 * 2**20, 8 * GIB) == "0.5/8.0 GiB"


def test_check_and_the_console_write_the_same_free_disk_alike(tmp_path: Path) -> None:
    free_mb = 74.1 * 1024
    inventory = write_inventory(
        tmp_path / "inventory.toml", hosts={"a": local_host(tmp_path / "a")}, jobs={}
    )
    inv = load(inventory)
    out = io.StringIO()
    render(inv, [Preflight(host="a", python="3.12.0", disk_free_mb=free_mb, ok=True)], out)
    header, row = out.getvalue().splitlines()[:2]
    checked = row[header.index("DISK FREE") :].split("  ")[0]

    ctl = Controller(inv, Policy.MANUAL)
    sample = Health(
        t=0.0,
        cpu_pct=1.0,
        mem_used_pct=1.0,
        mem_available_mb=1.0,
        disk_free_mb=free_mb,
        disk_total_mb=100 * 1024,
    )
    ctl.fleet.observe("a", sample)
    shown = fleet_rows(ctl)["a"][FLEET_COLUMNS.index("disk")]
    assert checked == shown == size_mb(free_mb) == "74 GiB"

    low = evaluate(sample, None, HealthThresholds(disk_free_warn_gb=80.0))
    (finding,) = [f for f in low if f.rule == "disk"]
    assert finding.message == "only 74 GiB free"
    assert not re.search(r"\d[KMGT]\b|\bMB\b|\bGB\b", finding.message)
