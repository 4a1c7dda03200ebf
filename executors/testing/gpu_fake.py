"""A stand-in for ``pynvml`` so GPU health and fault handling can be tested without a GPU.

:class:`FakeNvml` carries the function and constant names :mod:`executors.health.gpu` uses, with
the same return shapes as ``pynvml`` (objects with ``.gpu``, ``.used``/``.total``, bytes,
milliwatts, bit masks, event data with ``.device``/``.eventType``/``.eventData``) and the
same error style (``NVMLError`` with ``.value`` set to an ``NVML_ERROR_*`` code).

Two ways to build one:

* in-process, ``FakeNvml.from_state({...})``, then inject faults with
  :meth:`FakeNvml.inject_ecc_dbe`, :meth:`~FakeNvml.inject_xid`,
  :meth:`~FakeNvml.set_throttle`, :meth:`~FakeNvml.lose`, :meth:`~FakeNvml.update`;
* from a JSON file, ``FakeNvml(path)`` (what ``HOTSPARE_FAKE_NVML=path`` does). The file is
  re-read whenever it changes (checked with one ``stat`` per call), so a test can inject a
  fault into a running executor by rewriting it with :func:`write_state`. A missing file
  makes ``nvmlInit`` fail with LIBRARY_NOT_FOUND, like a host without NVML. The file format
  is in :mod:`executors.testing.gpu_fake_state`.
"""

from __future__ import annotations

import copy
import json
import math
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from executors.testing.gpu_fake_state import (
    DEFAULT_DEVICE,
    ERROR_NAMES,
    MIB,
    NVML_ERROR_DRIVER_NOT_LOADED,
    NVML_ERROR_FUNCTION_NOT_FOUND,
    NVML_ERROR_GPU_IS_LOST,
    NVML_ERROR_INVALID_ARGUMENT,
    NVML_ERROR_LIBRARY_NOT_FOUND,
    NVML_ERROR_NO_PERMISSION,
    NVML_ERROR_NOT_FOUND,
    NVML_ERROR_NOT_SUPPORTED,
    NVML_ERROR_RESET_REQUIRED,
    NVML_ERROR_TIMEOUT,
    NVML_ERROR_UNINITIALIZED,
    NVML_ERROR_UNKNOWN,
    NVML_SUCCESS,
    THROTTLE_BITS,
    error_code,
    write_state,
)

__all__ = ["THROTTLE_BITS", "FakeNvml", "NVMLError", "write_state"]


class NVMLError(Exception):
    """Same shape as ``pynvml.NVMLError``: the NVML return code is ``.value``."""

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return f"NVML_ERROR_{ERROR_NAMES.get(self.value, self.value)}"


@dataclass(frozen=True)
class FakeHandle:
    index: int


@dataclass(frozen=True)
class FakeEventData:
    device: FakeHandle
    eventType: int
    eventData: int
    gpuInstanceId: int = 0xFFFFFFFF
    computeInstanceId: int = 0xFFFFFFFF


@dataclass(frozen=True)
class FakeUtilization:
    gpu: int
    memory: int = 0


@dataclass(frozen=True)
class FakeMemory:
    total: int
    free: int
    used: int


class FakeNvml:
    """A module-like fake of ``pynvml`` backed by a state dict (see the module docstring)."""

    NVMLError = NVMLError

    NVML_SUCCESS = NVML_SUCCESS
    NVML_ERROR_UNINITIALIZED = NVML_ERROR_UNINITIALIZED
    NVML_ERROR_INVALID_ARGUMENT = NVML_ERROR_INVALID_ARGUMENT
    NVML_ERROR_NOT_SUPPORTED = NVML_ERROR_NOT_SUPPORTED
    NVML_ERROR_NO_PERMISSION = NVML_ERROR_NO_PERMISSION
    NVML_ERROR_NOT_FOUND = NVML_ERROR_NOT_FOUND
    NVML_ERROR_DRIVER_NOT_LOADED = NVML_ERROR_DRIVER_NOT_LOADED
    NVML_ERROR_TIMEOUT = NVML_ERROR_TIMEOUT
    NVML_ERROR_LIBRARY_NOT_FOUND = NVML_ERROR_LIBRARY_NOT_FOUND
    NVML_ERROR_FUNCTION_NOT_FOUND = NVML_ERROR_FUNCTION_NOT_FOUND
    NVML_ERROR_GPU_IS_LOST = NVML_ERROR_GPU_IS_LOST
    NVML_ERROR_RESET_REQUIRED = NVML_ERROR_RESET_REQUIRED
    NVML_ERROR_UNKNOWN = NVML_ERROR_UNKNOWN

    NVML_TEMPERATURE_GPU = 0
    NVML_VOLATILE_ECC = 0
    NVML_AGGREGATE_ECC = 1
    NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS = 0
    NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR = 1

    nvmlEventTypeXidCriticalError = 0x8

    nvmlClocksEventReasonGpuIdle = 0x1
    nvmlClocksEventReasonApplicationsClocksSetting = 0x2
    nvmlClocksEventReasonSwPowerCap = 0x4
    nvmlClocksEventReasonHwSlowdown = 0x8
    nvmlClocksEventReasonSyncBoost = 0x10
    nvmlClocksEventReasonSwThermalSlowdown = 0x20
    nvmlClocksEventReasonHwThermalSlowdown = 0x40
    nvmlClocksEventReasonHwPowerBrakeSlowdown = 0x80
    nvmlClocksEventReasonDisplayClockSetting = 0x100
    nvmlClocksEventReasonNone = 0x0
    nvmlClocksThrottleReasonGpuIdle = 0x1
    nvmlClocksThrottleReasonApplicationsClocksSetting = 0x2
    nvmlClocksThrottleReasonSwPowerCap = 0x4
    nvmlClocksThrottleReasonHwSlowdown = 0x8
    nvmlClocksThrottleReasonSyncBoost = 0x10
    nvmlClocksThrottleReasonSwThermalSlowdown = 0x20
    nvmlClocksThrottleReasonHwThermalSlowdown = 0x40
    nvmlClocksThrottleReasonHwPowerBrakeSlowdown = 0x80
    nvmlClocksThrottleReasonDisplayClockSetting = 0x100
    nvmlClocksThrottleReasonBoardLimit = 0x200
    nvmlClocksThrottleReasonReliability = 0x400
    nvmlClocksThrottleReasonNone = 0x0

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = Path(path) if path is not None else None
        self.state: dict[str, Any] = {"devices": []}
        self.calls: Counter[str] = Counter()
        self.loads = 0  # times the state file was (re-)read: tests check it stays cheap
        self.initialized = False
        self._stamp: tuple[int, int, int] | None = None
        self._file_missing = False
        # event set id -> {device index: number of that device's xids already delivered}
        self._event_sets: dict[int, dict[int, int]] = {}
        self._next_set = 1
        self._refresh()

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> FakeNvml:
        """An in-process fake; ``state`` is copied, so later edits go through the helpers."""
        fake = cls()
        fake._load(copy.deepcopy(state))
        return fake

    @classmethod
    def with_devices(cls, n: int, **overrides: Any) -> FakeNvml:
        """``n`` healthy default devices, each with ``overrides`` applied."""
        return cls.from_state({"devices": [dict(overrides) for _ in range(n)]})

    # ------------------------------------------------------------------ state

    def _load(self, state: dict[str, Any]) -> None:
        devices = [{**copy.deepcopy(DEFAULT_DEVICE), **d} for d in state.get("devices", [])]
        self.state = {**state, "devices": devices}

    def _refresh(self) -> None:
        """Re-read the file when its identity or mtime changed (atomic rename changes inode)."""
        if self.path is None:
            return
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            self._file_missing = True
            return
        stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        if stamp == self._stamp:
            return
        try:
            with open(self.path) as f:
                state = json.load(f)
        except (OSError, ValueError):
            return  # a non-atomic writer caught mid-write; keep the last good state
        self._stamp = stamp
        self._file_missing = False
        self.loads += 1
        self._load(state)

    def _save(self) -> None:
        if self.path is not None:
            write_state(self.path, self.state)
            st = os.stat(self.path)
            self._stamp = (st.st_ino, st.st_mtime_ns, st.st_size)

    def device(self, index: int) -> dict[str, Any]:
        """The live state dict of one device; change it through :meth:`update` to persist it."""
        self._refresh()
        return self.state["devices"][index]

    def update(self, index: int, **fields: Any) -> None:
        """Set any device fields (names as in the state format)."""
        unknown = set(fields) - set(DEFAULT_DEVICE)
        if unknown:
            raise KeyError(f"unknown device fields: {sorted(unknown)}")
        self.device(index).update(fields)
        self._save()

    def inject_ecc_dbe(self, index: int, n: int = 1) -> None:
        """``n`` more uncorrectable (double-bit) volatile ECC errors on device ``index``."""
        dev = self.device(index)
        self.update(index, ecc_uncorrected=int(dev["ecc_uncorrected"]) + n)

    def inject_xid(self, index: int, xid: int) -> None:
        """Raise XID ``xid`` on device ``index``; the next event-set drain delivers it once."""
        self.update(index, xids=[*self.device(index)["xids"], int(xid)])

    def set_throttle(self, index: int, *names: str) -> None:
        """Replace device ``index``'s active throttle reasons (see THROTTLE_BITS)."""
        unknown = [n for n in names if n not in THROTTLE_BITS]
        if unknown:
            raise KeyError(f"unknown throttle reasons: {unknown}")
        self.update(index, throttle=list(names))

    def lose(self, index: int) -> None:
        """Device ``index`` falls off the bus: every call on it raises GPU_IS_LOST."""
        self.update(index, lost=True)

    # ------------------------------------------------------------------ plumbing

    def _enter(self, fn: str, *, needs_init: bool = True) -> None:
        self.calls[fn] += 1
        self._refresh()
        if fn in self.state.get("missing", []):
            raise NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND)
        if needs_init and not self.initialized:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)

    def _dev(self, fn: str, handle: Any) -> dict[str, Any]:
        self._enter(fn)
        if not isinstance(handle, FakeHandle) or not (
            0 <= handle.index < len(self.state["devices"])
        ):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        dev = self.state["devices"][handle.index]
        if dev["lost"]:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        if fn in dev["unsupported"]:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return dev

    # ------------------------------------------------------------------ NVML API

    def nvmlInit(self) -> None:
        self._enter("nvmlInit", needs_init=False)
        if self._file_missing:
            raise NVMLError(NVML_ERROR_LIBRARY_NOT_FOUND)
        err = self.state.get("init_error")
        if err is not None:
            raise NVMLError(error_code(err))
        self.initialized = True

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self.initialized = False

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.state["devices"])

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeHandle:
        self._enter("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.state["devices"]):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        if self.state["devices"][index]["lost"]:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        return FakeHandle(index)

    def nvmlDeviceGetIndex(self, handle: FakeHandle) -> int:
        self._dev("nvmlDeviceGetIndex", handle)
        return handle.index

    def nvmlDeviceGetName(self, handle: FakeHandle) -> str:
        return str(self._dev("nvmlDeviceGetName", handle)["name"])

    def nvmlDeviceGetUtilizationRates(self, handle: FakeHandle) -> FakeUtilization:
        dev = self._dev("nvmlDeviceGetUtilizationRates", handle)
        reads = self.calls["nvmlDeviceGetUtilizationRates"]
        util = dev["util_pct"] + dev["util_wave"] * math.sin(0.9 * reads + handle.index)
        return FakeUtilization(gpu=round(min(max(util, 0.0), 100.0)))

    def nvmlDeviceGetMemoryInfo(self, handle: FakeHandle, version: Any = None) -> FakeMemory:
        dev = self._dev("nvmlDeviceGetMemoryInfo", handle)
        total = int(dev["mem_total_mb"] * MIB)
        used = int(dev["mem_used_mb"] * MIB)
        return FakeMemory(total=total, free=total - used, used=used)

    def nvmlDeviceGetTemperature(self, handle: FakeHandle, sensor: int) -> int:
        dev = self._dev("nvmlDeviceGetTemperature", handle)
        if sensor != self.NVML_TEMPERATURE_GPU:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return int(dev["temp_c"])

    def nvmlDeviceGetTemperatureV(self, handle: FakeHandle, sensor: int, version: int = 0) -> int:
        dev = self._dev("nvmlDeviceGetTemperatureV", handle)
        if sensor != self.NVML_TEMPERATURE_GPU:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return int(dev["temp_c"])

    def nvmlDeviceGetPowerUsage(self, handle: FakeHandle) -> int:
        return round(self._dev("nvmlDeviceGetPowerUsage", handle)["power_w"] * 1000)

    def _throttle_mask(self, fn: str, handle: FakeHandle) -> int:
        mask = 0
        for name in self._dev(fn, handle)["throttle"]:
            mask |= THROTTLE_BITS[name]
        return mask

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: FakeHandle) -> int:
        return self._throttle_mask("nvmlDeviceGetCurrentClocksEventReasons", handle)

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: FakeHandle) -> int:
        return self._throttle_mask("nvmlDeviceGetCurrentClocksThrottleReasons", handle)

    def nvmlDeviceGetTotalEccErrors(
        self, handle: FakeHandle, errorType: int, counterType: int
    ) -> int:
        dev = self._dev("nvmlDeviceGetTotalEccErrors", handle)
        if counterType != self.NVML_VOLATILE_ECC:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)  # the fake keeps volatile counts only
        if errorType == self.NVML_MEMORY_ERROR_TYPE_CORRECTED:
            return int(dev["ecc_corrected"])
        if errorType == self.NVML_MEMORY_ERROR_TYPE_UNCORRECTED:
            return int(dev["ecc_uncorrected"])
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)

    def nvmlDeviceGetRetiredPages(self, device: FakeHandle, sourceFilter: int) -> list[int]:
        dev = self._dev("nvmlDeviceGetRetiredPages", device)
        if sourceFilter == self.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS:
            n, base = int(dev["retired_pages_sbe"]), 0x1000_0000
        elif sourceFilter == self.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR:
            n, base = int(dev["retired_pages_dbe"]), 0x2000_0000
        else:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return [base + i * 0x1000 for i in range(n)]

    def nvmlDeviceGetRemappedRows(self, device: FakeHandle) -> tuple[int, int, int, int]:
        dev = self._dev("nvmlDeviceGetRemappedRows", device)
        return (
            int(dev["remapped_rows_corrected"]),
            int(dev["remapped_rows_uncorrected"]),
            int(bool(dev["remap_pending"])),
            int(bool(dev["remap_failure"])),
        )

    def nvmlDeviceGetPcieReplayCounter(self, handle: FakeHandle) -> int:
        return int(self._dev("nvmlDeviceGetPcieReplayCounter", handle)["pcie_replays"])

    def nvmlEventSetCreate(self) -> int:
        self._enter("nvmlEventSetCreate")
        set_id = self._next_set
        self._next_set += 1
        self._event_sets[set_id] = {}
        return set_id

    def nvmlDeviceRegisterEvents(self, handle: FakeHandle, eventTypes: int, eventSet: int) -> None:
        self._dev("nvmlDeviceRegisterEvents", handle)
        if eventSet not in self._event_sets:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        if eventTypes & self.nvmlEventTypeXidCriticalError:
            self._event_sets[eventSet].setdefault(handle.index, 0)

    def nvmlEventSetWait(self, eventSet: int, timeoutms: int) -> FakeEventData:
        """The oldest undelivered XID of a registered device; TIMEOUT at once when none."""
        self._enter("nvmlEventSetWait")
        registered = self._event_sets.get(eventSet)
        if registered is None:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        devices = self.state["devices"]
        for index in sorted(registered):
            if index >= len(devices):
                continue
            xids = devices[index]["xids"]
            delivered = min(registered[index], len(xids))  # the file may have been reset
            if delivered < len(xids):
                registered[index] = delivered + 1
                return FakeEventData(
                    device=FakeHandle(index),
                    eventType=self.nvmlEventTypeXidCriticalError,
                    eventData=int(xids[delivered]),
                )
            registered[index] = delivered
        raise NVMLError(NVML_ERROR_TIMEOUT)

    def nvmlEventSetFree(self, eventSet: int) -> None:
        self._enter("nvmlEventSetFree")
        if self._event_sets.pop(eventSet, None) is None:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
