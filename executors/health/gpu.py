"""The one place the executor talks to NVML.

Everything NVML can do wrong (no library, no driver, a counter the board lacks, a GPU
that fell off the bus) turns into data here: a status line, a None field, ``lost=True``.
Nothing raises out of :meth:`GpuSampler.sample`, so health reporting never takes the
executor down. ``nvml`` is duck-typed on the ``pynvml`` module so tests can pass
:class:`executors.testing.gpu_fake.FakeNvml` instead.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable
from typing import Any

from protocol.errors import HotspareError
from protocol.messages import GpuHealth

FAKE_NVML_ENV = "HOTSPARE_FAKE_NVML"

_MIB = 1024 * 1024

# NVML's clocks event (throttle) reason bits; fixed by the C ABI, so no need to look them up.
# Left out on purpose: GpuIdle (0x1), ApplicationsClocksSetting (0x2), DisplayClockSetting
# (0x100): they are normal operation, not a sign of trouble.
THROTTLE_REASONS: tuple[tuple[int, str], ...] = (
    (0x0000000000000004, "sw_power_cap"),
    (0x0000000000000008, "hw_slowdown"),
    (0x0000000000000010, "sync_boost"),
    (0x0000000000000020, "sw_thermal"),
    (0x0000000000000040, "hw_thermal"),
    (0x0000000000000080, "hw_power_brake"),
    (0x0000000000000200, "board_limit"),
    (0x0000000000000400, "reliability"),
)

_MAX_EVENTS_PER_SAMPLE = 10_000  # a guard against a driver that never says "timeout"


def throttle_names(bits: int) -> list[str]:
    """Short names for the worrying bits of an NVML clocks event reason mask."""
    return [name for bit, name in THROTTLE_REASONS if bits & bit]


def load_nvml() -> Any | None:
    """The NVML binding to use: the fake named by ``$HOTSPARE_FAKE_NVML``, else ``pynvml``.

    Returns None when ``pynvml`` is not installed (a console-only host has no GPU).
    """
    fake = os.environ.get(FAKE_NVML_ENV)
    if fake:
        from executors.testing.gpu_fake import FakeNvml

        return FakeNvml(fake)
    try:
        import pynvml
    except ImportError:
        return None
    return pynvml


class _Lost(HotspareError):
    """Internal: a read said the device is gone; abandon the rest of that device's reads."""

    permanent = False


def _handle_key(handle: Any) -> Any:
    """A hashable identity for a device handle; real ones are ctypes pointers: use the address."""
    if isinstance(handle, ctypes._Pointer):
        return ("ptr", ctypes.cast(handle, ctypes.c_void_p).value)
    try:
        hash(handle)
    except TypeError:
        return ("id", id(handle))
    return handle


class GpuSampler:
    """Reads every GPU's health counters through NVML; ``status`` says why there are none."""

    def __init__(self, nvml: Any | None = None, loader: Callable[[], Any] = load_nvml) -> None:
        self._lock = threading.Lock()
        self._nvml: Any | None = None
        self._handles: list[Any | None] = []
        self._names: list[str] = []
        self._lost_at_init: list[bool] = []
        self._keys: dict[Any, int] = {}
        self._events: Any | None = None
        self.status = "no GPU"
        self._start(nvml, loader)

    # ------------------------------------------------------------------ setup

    def _start(self, nvml: Any | None, loader: Callable[[], Any]) -> None:
        if nvml is None:
            try:
                nvml = loader()
            except Exception as e:  # a broken fake or binding is still "no GPU", not a crash
                self.status = f"no GPU (cannot load NVML binding: {e})"
                return
            if nvml is None:
                self.status = "no GPU (pynvml not installed)"
                return
        try:
            nvml.nvmlInit()
        except Exception as e:
            self.status = f"no GPU ({_init_failure(nvml, e)})"
            return
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except Exception as e:
            self.status = f"no GPU (cannot count devices: {e})"
            _quiet(nvml.nvmlShutdown)
            return
        if count <= 0:
            self.status = "no GPU (NVML reports 0 devices)"
            _quiet(nvml.nvmlShutdown)
            return
        self._nvml = nvml
        for index in range(count):
            self._handles.append(None)
            self._names.append("")
            self._lost_at_init.append(False)
            self._acquire(index)
        self._register_events()
        self.status = f"ok: {count} GPUs"

    def _acquire(self, index: int) -> Any | None:
        """Get (or retry getting) a device handle and its name; remember a lost device."""
        nvml = self._nvml
        assert nvml is not None
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
        except nvml.NVMLError as e:
            self._lost_at_init[index] = _is_lost(nvml, e)
            return None
        except Exception:
            return None
        self._handles[index] = handle
        self._lost_at_init[index] = False
        self._keys[_handle_key(handle)] = index
        try:
            name = nvml.nvmlDeviceGetName(handle)
            self._names[index] = name.decode() if isinstance(name, bytes) else str(name)
        except Exception:
            pass
        if self._events is not None:
            self._register(index, handle)
        return handle

    def _register_events(self) -> None:
        """XID errors arrive only as events, so subscribe once; a board without them is fine."""
        nvml = self._nvml
        assert nvml is not None
        try:
            self._events = nvml.nvmlEventSetCreate()
        except Exception:
            self._events = None
            return
        for index, handle in enumerate(self._handles):
            if handle is not None:
                self._register(index, handle)

    def _register(self, index: int, handle: Any) -> None:
        nvml = self._nvml
        assert nvml is not None
        try:
            nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, self._events)
        except Exception:  # NotSupported (e.g. some vGPU / MIG setups): no XIDs for this one
            pass

    # ------------------------------------------------------------------ sampling

    @property
    def device_count(self) -> int:
        return len(self._handles)

    def sample(self) -> list[GpuHealth]:
        """One GpuHealth per device; [] without NVML. Never raises."""
        with self._lock:
            if self._nvml is None:
                return []
            try:
                return self._sample()
            except Exception:  # belt and braces: a bug here must not stop health reports
                return [GpuHealth(index=i, name=n) for i, n in enumerate(self._names)]

    def _sample(self) -> list[GpuHealth]:
        out: list[GpuHealth] = []
        for index in range(len(self._handles)):
            handle = self._handles[index]
            if handle is None:
                handle = self._acquire(index)
            if handle is None:
                out.append(
                    GpuHealth(index=index, name=self._names[index], lost=self._lost_at_init[index])
                )
                continue
            try:
                out.append(self._read_device(index, handle))
            except _Lost:
                out.append(GpuHealth(index=index, name=self._names[index], lost=True))
        self._drain_xids(out)
        return out

    def _read(self, fn_name: str, *args: Any) -> Any | None:
        """Call one NVML getter; None if it fails, _Lost if the device is gone."""
        nvml = self._nvml
        assert nvml is not None
        try:
            return getattr(nvml, fn_name)(*args)
        except nvml.NVMLError as e:
            if _is_lost(nvml, e):
                raise _Lost from e
            return None
        except Exception:
            return None

    def _read_device(self, index: int, h: Any) -> GpuHealth:
        nvml = self._nvml
        assert nvml is not None
        g = GpuHealth(index=index, name=self._names[index])

        util = self._read("nvmlDeviceGetUtilizationRates", h)
        if util is not None:
            g.util_pct = float(util.gpu)
        mem = self._read("nvmlDeviceGetMemoryInfo", h)
        if mem is not None:
            g.mem_used_mb = mem.used / _MIB
            g.mem_total_mb = mem.total / _MIB
        temp = self._read("nvmlDeviceGetTemperature", h, nvml.NVML_TEMPERATURE_GPU)
        if temp is None:  # the old call is deprecated (gone with CUDA 14); try its successor
            temp = self._read("nvmlDeviceGetTemperatureV", h, nvml.NVML_TEMPERATURE_GPU)
        if temp is not None:
            g.temp_c = float(temp)
        milliwatts = self._read("nvmlDeviceGetPowerUsage", h)
        if milliwatts is not None:
            g.power_w = milliwatts / 1000.0
        g.throttle = tuple(self._throttle(h))

        g.ecc_corrected = self._ecc(h, nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED)
        g.ecc_uncorrected = self._ecc(h, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED)
        sbe = self._read(
            "nvmlDeviceGetRetiredPages",
            h,
            nvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
        )
        g.retired_pages_sbe = None if sbe is None else len(sbe)
        dbe = self._read(
            "nvmlDeviceGetRetiredPages", h, nvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
        )
        g.retired_pages_dbe = None if dbe is None else len(dbe)
        rows = self._read("nvmlDeviceGetRemappedRows", h)
        if rows is not None:
            corr, unc, pending, failure = rows
            g.remapped_rows_corrected = int(corr)
            g.remapped_rows_uncorrected = int(unc)
            g.remap_pending = bool(pending)
            g.remap_failure = bool(failure)
        replays = self._read("nvmlDeviceGetPcieReplayCounter", h)
        g.pcie_replays = None if replays is None else int(replays)
        return g

    def _ecc(self, h: Any, error_type: int) -> int | None:
        nvml = self._nvml
        assert nvml is not None
        n = self._read("nvmlDeviceGetTotalEccErrors", h, error_type, nvml.NVML_VOLATILE_ECC)
        return None if n is None else int(n)

    def _throttle(self, h: Any) -> list[str]:
        """Prefer the current name (EventReasons); older drivers/bindings only have Throttle."""
        nvml = self._nvml
        assert nvml is not None
        for fn_name in (
            "nvmlDeviceGetCurrentClocksEventReasons",
            "nvmlDeviceGetCurrentClocksThrottleReasons",
        ):
            if getattr(nvml, fn_name, None) is None:
                continue
            try:
                return throttle_names(int(getattr(nvml, fn_name)(h)))
            except nvml.NVMLError as e:
                if _is_lost(nvml, e):
                    raise _Lost from e
                if e.value != nvml.NVML_ERROR_FUNCTION_NOT_FOUND:
                    return []
            except Exception:
                return []
        return []

    def _drain_xids(self, out: list[GpuHealth]) -> None:
        """Pull every pending XID event (each is delivered once) onto its device's record."""
        nvml = self._nvml
        if nvml is None or self._events is None:
            return
        for _ in range(_MAX_EVENTS_PER_SAMPLE):
            try:
                event = nvml.nvmlEventSetWait(self._events, 0)
            except Exception:  # NVML_ERROR_TIMEOUT: nothing more pending (or the set broke)
                return
            if int(event.eventType) != nvml.nvmlEventTypeXidCriticalError:
                continue
            index = self._keys.get(_handle_key(event.device))
            if index is None:
                try:
                    index = int(nvml.nvmlDeviceGetIndex(event.device))
                except Exception:
                    continue
            if 0 <= index < len(out):
                out[index].xids = (*out[index].xids, int(event.eventData))

    # ------------------------------------------------------------------ teardown

    def close(self) -> None:
        """Release the event set and NVML; later samples are []."""
        with self._lock:
            nvml, self._nvml = self._nvml, None
            if nvml is None:
                return
            if self._events is not None:
                _quiet(nvml.nvmlEventSetFree, self._events)
                self._events = None
            _quiet(nvml.nvmlShutdown)
            self.status = "no GPU (NVML shut down)"

    def __enter__(self) -> GpuSampler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _is_lost(nvml: Any, err: Exception) -> bool:
    """GPU_IS_LOST (fell off the bus) and RESET_REQUIRED both mean the device is unusable."""
    value = getattr(err, "value", None)
    return value in (
        getattr(nvml, "NVML_ERROR_GPU_IS_LOST", 15),
        getattr(nvml, "NVML_ERROR_RESET_REQUIRED", 16),
    )


def _init_failure(nvml: Any, err: Exception) -> str:
    value = getattr(err, "value", None)
    if value == getattr(nvml, "NVML_ERROR_LIBRARY_NOT_FOUND", 12):
        return "NVML library not found"
    if value == getattr(nvml, "NVML_ERROR_DRIVER_NOT_LOADED", 9):
        return "NVIDIA driver not loaded"
    if value == getattr(nvml, "NVML_ERROR_NO_PERMISSION", 4):
        return "no permission to use NVML"
    return f"NVML init failed: {err}"


def _quiet(fn: Callable[..., Any], *args: Any) -> None:
    try:
        fn(*args)
    except Exception:
        pass
