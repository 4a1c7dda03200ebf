"""Host health for the executor's periodic ``Health`` message.

Cheap enough to call every few seconds from the executor's loop: no sleeping, rates are
deltas since the previous call, and a counter psutil cannot read becomes 0.0 rather
than an exception (a container may have no disk or network counters at all).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import psutil

from executors.fencing import cgroup
from executors.health.gpu import GpuSampler
from protocol.messages import Health

_MIB = 1024 * 1024


class _Rate:
    """Bytes/s of a monotonically increasing counter between successive reads."""

    def __init__(self) -> None:
        self._last: tuple[float, float] | None = None

    def update(self, now: float, value: float | None) -> float:
        if value is None:
            self._last = None
            return 0.0
        last, self._last = self._last, (now, value)
        if last is None:
            return 0.0
        dt, dv = now - last[0], value - last[1]
        if dt <= 0 or dv < 0:  # clock hiccup, or counters reset (a NIC went away)
            return 0.0
        return dv / dt


def containment() -> str:
    """What would contain a run this process starts (``Health.containment``): the same test
    the command kind makes before each run (``executors.fencing.run.new_cgroup``)."""
    why = cgroup.usable()
    return "cgroup" if why is None else f"fence: {why}"


class HealthSampler:
    """Samples CPU, memory, the workdir's disk, I/O rates and GPUs into one Health."""

    def __init__(self, workdir: Path, gpu: GpuSampler | None = None) -> None:
        """Without ``gpu``, one is made (and owned, so :meth:`close` shuts NVML down)."""
        self.workdir = Path(workdir)
        self._owns_gpu = gpu is None
        self.gpu = GpuSampler() if gpu is None else gpu
        self._disk_read = _Rate()
        self._disk_write = _Rate()
        self._net_rx = _Rate()
        self._net_tx = _Rate()
        self.containment = containment()
        # cpu_percent(None) measures since the previous call; prime it so the first
        # sample() reports usage since construction instead of a meaningless 0.0.
        psutil.cpu_percent(interval=None)

    def sample(self) -> Health:
        now = time.monotonic()
        mem = psutil.virtual_memory()
        free_mb, total_mb = self._disk_space()
        disk = _counters(psutil.disk_io_counters)
        net = _counters(psutil.net_io_counters)
        return Health(
            t=time.time(),
            cpu_pct=float(psutil.cpu_percent(interval=None)),
            mem_used_pct=float(mem.percent),
            mem_available_mb=mem.available / _MIB,
            disk_free_mb=free_mb,
            disk_total_mb=total_mb,
            disk_read_bps=self._disk_read.update(now, _attr(disk, "read_bytes")),
            disk_write_bps=self._disk_write.update(now, _attr(disk, "write_bytes")),
            net_rx_bps=self._net_rx.update(now, _attr(net, "bytes_recv")),
            net_tx_bps=self._net_tx.update(now, _attr(net, "bytes_sent")),
            gpu_status=self.gpu.status,
            gpus=tuple(self.gpu.sample()),
            containment=self.containment,
        )

    def _disk_space(self) -> tuple[float, float]:
        """Free/total MiB of the filesystem that holds (or will hold) the workdir; 0 if unknown."""
        path = self.workdir.absolute()
        while not path.exists() and path != path.parent:
            path = path.parent
        try:
            usage = psutil.disk_usage(str(path))
        except OSError:
            return 0.0, 0.0
        return usage.free / _MIB, usage.total / _MIB

    def close(self) -> None:
        if self._owns_gpu:
            self.gpu.close()


def _counters(fn: Any) -> Any | None:
    try:
        return fn()
    except Exception:  # psutil raises on some containers / odd /proc layouts
        return None


def _attr(counters: Any | None, name: str) -> float | None:
    value = getattr(counters, name, None) if counters is not None else None
    return None if value is None else float(value)
