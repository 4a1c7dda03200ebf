"""The controller as a service in tests (``hotspare serve``): the command, a one-job inventory
on local hosts with the lease a restart lands inside, the environment its executors start
with, and a process's start time (the same pid and start time: the same process)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from support.fleetbed import EXECUTOR_ENV, local_host, stdlib_job, write_inventory

HOTSPARE = Path(sys.executable).with_name("hotspare")
LEASE_S = 8.0
"""Long enough for a controller's restart on a busy 2-core machine (an interpreter, imports,
the inventory) to land inside it: the figure is measured by benchmarks/console_restart.py."""


def inventory(tmp_path: Path, **console: object) -> Path:
    return write_inventory(
        tmp_path / "inventory.toml",
        hosts={"a": local_host(tmp_path / "a"), "b": local_host(tmp_path / "b", role="spare")},
        jobs={"j": {"host": "a", "spares": ["b"], **stdlib_job(steps=400_000)}},
        **console,
    )


def env() -> dict[str, str]:
    hook = json.dumps({h: dict(EXECUTOR_ENV) for h in ("a", "b")})
    return {**os.environ, "HOTSPARE_EXECUTOR_ENV": hook, "OMP_NUM_THREADS": "1"}


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks (``/proc/PID/stat`` field 22): the same pid
    with the same start time is the same process."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except OSError:
        return None
