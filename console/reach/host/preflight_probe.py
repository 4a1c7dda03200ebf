"""The preflight probe: what a host offers a job, as one JSON line: its Python, torch and
CUDA, NVML, the free disk under the root (creating nothing: a root not made yet is judged by
the folder it will be made in), whether the bundle is deployed, and what contains runs there
(a cgroup of their own, or their fence only, and why). Run on the host as ``python -c SOURCE
ROOT BUNDLE_DIR``, by whatever Python the host has (it must run on one too old for the
executor, to say so). The standard library, then torch and pynvml where they import."""

from __future__ import annotations

import json
import os
import shutil
import sys
from typing import Any


def disk(root: str, out: dict[str, Any]) -> None:
    try:
        here = os.path.abspath(root)
        while not os.path.isdir(here):
            if os.path.lexists(here):
                raise NotADirectoryError(f"{here} is not a folder")
            here = os.path.dirname(here)
        if not os.access(here, os.W_OK | os.X_OK):
            raise PermissionError(f"{here} is not writable")
        out["disk_free_mb"] = shutil.disk_usage(here).free / 2**20
    except OSError as e:
        out["disk_error"] = str(e)


def torch_facts(out: dict[str, Any]) -> None:
    try:
        import torch

        out["torch"] = torch.__version__
        out["cuda"] = bool(torch.cuda.is_available())
        out["cuda_devices"] = torch.cuda.device_count() if out["cuda"] else 0
    except Exception as e:  # noqa: BLE001 - any failure to import or ask is the finding
        out["torch_error"] = f"{type(e).__name__}: {e}"


def containment(out: dict[str, Any]) -> None:
    """Where runs get a cgroup of their own (``executors/fencing/cgroup.py``: keep in step)."""
    try:
        mount = None
        with open("/proc/self/mountinfo") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                if right.split()[:1] == ["cgroup2"]:
                    mount = left.split()[4]
        if mount is None:
            raise OSError("no cgroup v2 hierarchy is mounted")
        with open("/proc/self/cgroup") as f:
            own = [line[3:].strip() for line in f if line.startswith("0::")]
        here = os.path.normpath(os.path.join(mount, own[0].lstrip("/"))) if own else mount
        if not os.access(here, os.W_OK):
            raise OSError(f"{here} is not writable by this user (no delegated cgroup)")
        if here != mount and not os.path.exists(os.path.join(here, "cgroup.kill")):
            raise OSError("the kernel has no cgroup.kill (Linux 5.14 or later)")
        out["containment"] = "cgroup"
    except OSError as e:
        out["containment"] = "fence"
        out["containment_why"] = str(e)


def nvml(out: dict[str, Any]) -> None:
    try:
        import pynvml

        pynvml.nvmlInit()
        out["nvml"] = f"ok: {pynvml.nvmlDeviceGetCount()} GPUs"
    except Exception as e:  # noqa: BLE001 - any failure to import or ask is the finding
        out["nvml"] = f"no GPU ({str(e) or type(e).__name__})"


def main(argv: list[str]) -> int:
    root, bundle = argv[:2]
    out: dict[str, Any] = {
        "python": "%d.%d.%d" % sys.version_info[:3],  # noqa: UP031 - three ints, joined
        "torch": None,
        "torch_error": None,
        "cuda": False,
        "cuda_devices": 0,
        "nvml": None,
        "disk_free_mb": None,
        "bundle": os.path.exists(os.path.join(bundle, ".complete")),
    }
    disk(root, out)
    torch_facts(out)
    containment(out)
    nvml(out)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
