"""Health rules in the style of DCGM: each finding is a WARN (alert) or a FAIL (drain, fail over)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from console.inventory import HealthThresholds
from protocol.messages import Health
from protocol.units import size_mb


class Severity(StrEnum):
    WARN = "warn"
    FAIL = "fail"


@dataclass(frozen=True)
class Finding:
    severity: Severity
    rule: str
    message: str


def evaluate(h: Health, previous: Health | None, t: HealthThresholds) -> list[Finding]:
    """Findings for one sample; ``previous`` turns counters into rates."""
    out: list[Finding] = []
    before = {g.index: g for g in previous.gpus} if previous else {}
    for g in h.gpus:
        gpu = f"GPU {g.index}"
        if g.lost:
            out.append(Finding(Severity.FAIL, "gpu_lost", f"{gpu} fell off the bus"))
            continue
        if g.ecc_uncorrected:
            out.append(
                Finding(
                    Severity.FAIL, "ecc_dbe", f"{gpu}: {g.ecc_uncorrected} uncorrectable ECC errors"
                )
            )
        if g.remap_failure:
            out.append(Finding(Severity.FAIL, "row_remap_failure", f"{gpu}: row remapping failed"))
        for xid in g.xids:
            if xid in t.fail_xids:
                out.append(Finding(Severity.FAIL, f"xid_{xid}", f"{gpu}: XID {xid}"))
        hot = [r for r in g.throttle if r in t.warn_throttle]
        if hot:
            out.append(Finding(Severity.WARN, "throttle", f"{gpu} throttled: {', '.join(hot)}"))
        if g.temp_c is not None and g.temp_c >= t.temp_warn_c:
            out.append(Finding(Severity.WARN, "temperature", f"{gpu} at {g.temp_c:.0f} C"))
        prev = before.get(g.index)
        if g.pcie_replays is not None and prev is not None and prev.pcie_replays is not None:
            rate = g.pcie_replays - prev.pcie_replays
            if rate >= t.pcie_replays_warn:
                out.append(
                    Finding(
                        Severity.WARN,
                        "pcie_replays",
                        f"{gpu}: {rate} PCIe replays since the last sample",
                    )
                )
    if h.disk_total_mb and h.disk_free_mb < t.disk_free_warn_gb * 1024:
        out.append(Finding(Severity.WARN, "disk", f"only {size_mb(h.disk_free_mb)} free"))
    return out
