"""The fake NVML's state: the file format ``HOTSPARE_FAKE_NVML`` points at, its defaults and
NVML's error codes, and :func:`write_state` to change a running executor's GPUs.

State format (JSON object; every key optional)::

    {
      "init_error": null,          # or an NVML_ERROR_* name ("DRIVER_NOT_LOADED") / code:
                                   #   nvmlInit raises it
      "missing": [],               # NVML function names that raise FUNCTION_NOT_FOUND
                                   #   (an old driver), e.g.
                                   #   "nvmlDeviceGetCurrentClocksEventReasons"
      "devices": [                 # one object per GPU, index = position
        {
          "name": "Fake H100",
          "util_pct": 0,           # nvmlDeviceGetUtilizationRates().gpu
          "util_wave": 0,          # +- this much around util_pct, a step per read (a demo's
                                   #   sparkline moves); 0: util_pct exactly
          "mem_used_mb": 0,        # MiB; the fake reports bytes like NVML
          "mem_total_mb": 81920,
          "temp_c": 40,
          "power_w": 100.0,        # the fake reports milliwatts like NVML
          "throttle": [],          # names from executors.health.gpu.THROTTLE_REASONS, plus
                                   #   "gpu_idle", "app_clocks", "display_clock"
          "ecc_corrected": 0,      # volatile ECC counts
          "ecc_uncorrected": 0,
          "retired_pages_sbe": 0,  # number of retired pages per cause
          "retired_pages_dbe": 0,
          "remapped_rows_corrected": 0,
          "remapped_rows_uncorrected": 0,
          "remap_pending": false,
          "remap_failure": false,
          "pcie_replays": 0,
          "xids": [],              # every XID ever raised here, oldest first: APPEND to raise
                                   #   one; each entry is delivered once per event set
          "lost": false,           # every call on the device raises GPU_IS_LOST
          "unsupported": []        # NVML function names that raise NOT_SUPPORTED here,
                                   #   e.g. "nvmlDeviceGetPcieReplayCounter"
        }
      ]
    }
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_UNKNOWN = 999

ERROR_NAMES = {
    NVML_ERROR_UNINITIALIZED: "UNINITIALIZED",
    NVML_ERROR_INVALID_ARGUMENT: "INVALID_ARGUMENT",
    NVML_ERROR_NOT_SUPPORTED: "NOT_SUPPORTED",
    NVML_ERROR_NO_PERMISSION: "NO_PERMISSION",
    NVML_ERROR_NOT_FOUND: "NOT_FOUND",
    NVML_ERROR_DRIVER_NOT_LOADED: "DRIVER_NOT_LOADED",
    NVML_ERROR_TIMEOUT: "TIMEOUT",
    NVML_ERROR_LIBRARY_NOT_FOUND: "LIBRARY_NOT_FOUND",
    NVML_ERROR_FUNCTION_NOT_FOUND: "FUNCTION_NOT_FOUND",
    NVML_ERROR_GPU_IS_LOST: "GPU_IS_LOST",
    NVML_ERROR_RESET_REQUIRED: "RESET_REQUIRED",
    NVML_ERROR_UNKNOWN: "UNKNOWN",
}

THROTTLE_BITS: dict[str, int] = {
    "gpu_idle": 0x1,
    "app_clocks": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal": 0x20,
    "hw_thermal": 0x40,
    "hw_power_brake": 0x80,
    "display_clock": 0x100,
    "board_limit": 0x200,
    "reliability": 0x400,
}

MIB = 1024 * 1024

DEFAULT_DEVICE: dict[str, Any] = {
    "name": "Fake H100",
    "util_pct": 0,
    "util_wave": 0,
    "mem_used_mb": 0,
    "mem_total_mb": 81920,
    "temp_c": 40,
    "power_w": 100.0,
    "throttle": [],
    "ecc_corrected": 0,
    "ecc_uncorrected": 0,
    "retired_pages_sbe": 0,
    "retired_pages_dbe": 0,
    "remapped_rows_corrected": 0,
    "remapped_rows_uncorrected": 0,
    "remap_pending": False,
    "remap_failure": False,
    "pcie_replays": 0,
    "xids": [],
    "lost": False,
    "unsupported": [],
}


def write_state(path: str | os.PathLike[str], state: dict[str, Any]) -> None:
    """Replace the state file atomically, so a reader never sees half a file."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(state, f, indent=1)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def error_code(value: int | str) -> int:
    if isinstance(value, int):
        return value
    name = value.upper().removeprefix("NVML_ERROR_")
    for code, known in ERROR_NAMES.items():
        if known == name:
            return code
    raise ValueError(f"unknown NVML error name {value!r}")
