"""A job's workload and ``[config]`` checked as the inventory loads, against the workloads
both sides know (``protocol/workloads.py``): so ``hotspare check`` and ``run`` say a misspelt
name or key in one line (file, key path, line, a guess), before any host is reached."""

from __future__ import annotations

from pathlib import Path

from protocol import workloads
from protocol.spec import JobSpec


def check_workload(spec: JobSpec, *, file: Path, text: str) -> None:
    """ConfigError naming ``jobs.NAME.workload`` or ``jobs.NAME.config...`` where it is wrong
    (``protocol.workloads.check_workload``, the check an executor makes too)."""
    workloads.check_workload(
        spec.executor, spec.workload, spec.config, file=file, text=text, keys=["jobs", spec.name]
    )


__all__ = ["check_workload"]
