"""A job's workload and ``[config]`` checked as the inventory loads, against the workloads
both sides know (``protocol/workloads.py``): so ``hotspare check`` and ``run`` say a misspelt
name or key in one line (file, key path, line, a guess), before any host is reached."""

from __future__ import annotations

from pathlib import Path

from protocol.config import _key_path, convert, find_line
from protocol.errors import ConfigError
from protocol.spec import JobSpec
from protocol.workloads import BUILTIN_WORKLOADS, config_schema, is_factory, unknown_workload


def check_workload(spec: JobSpec, *, file: Path, text: str) -> None:
    """ConfigError naming ``jobs.NAME.workload`` or ``jobs.NAME.config...`` where it is wrong.

    A kind other than ``torch`` and a ``"module:factory"`` workload are the host's to judge."""
    keys = ["jobs", spec.name]
    if spec.executor != "torch":
        return
    if not is_factory(spec.workload) and spec.workload not in BUILTIN_WORKLOADS:
        where = [*keys, "workload"]
        line = find_line(text, where)
        at = f"{file}:{line}" if line else str(file)
        raise ConfigError(f"{at}: {_key_path(where)}: {unknown_workload(spec.workload)}")
    schema = config_schema(spec.executor, spec.workload)
    if schema is not None:
        convert(spec.config, schema, file=file, text=text, prefix=[*keys, "config"])


__all__ = ["check_workload"]
