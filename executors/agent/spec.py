"""Loading a job spec from a standalone job TOML or from ``[jobs.NAME]`` of an inventory."""

from __future__ import annotations

from pathlib import Path

from protocol.config import convert, read_toml
from protocol.errors import ConfigError
from protocol.layouts import expand
from protocol.spec import PLACEMENT_KEYS, JobSpec


def load_spec(path: Path, job: str | None = None) -> JobSpec:
    """Read a job spec. An inventory (a file with a ``[jobs]`` table) needs ``job`` unless it has one job."""
    data, text = read_toml(path)
    prefix: list[str] = []
    if "jobs" in data:
        jobs = data["jobs"]
        if not isinstance(jobs, dict) or not jobs:
            raise ConfigError(f"{path}: jobs: expected at least one [jobs.NAME] table")
        if job is None:
            if len(jobs) != 1:
                raise ConfigError(
                    f"{path}: several jobs ({', '.join(sorted(jobs))}); choose one with --job"
                )
            job = next(iter(jobs))
        if job not in jobs:
            raise ConfigError(f"{path}: jobs.{job}: no such job (have: {', '.join(sorted(jobs))})")
        table = jobs[job]
        if not isinstance(table, dict):
            raise ConfigError(f"{path}: jobs.{job}: expected a table")
        if table.get("name", job) != job:
            raise ConfigError(
                f"{path}: jobs.{job}.name: {table['name']!r} differs from the table's name; drop it"
            )
        data = {"name": job, **{k: v for k, v in table.items() if k not in PLACEMENT_KEYS}}
        prefix = ["jobs", job]
    elif job is not None and data.get("name") != job:
        raise ConfigError(f"{path}: name: the spec is for job {data.get('name')!r}, not {job!r}")
    data = expand(data, file=path, text=text, keys=prefix)
    return convert(data, JobSpec, file=path, text=text, prefix=prefix)
