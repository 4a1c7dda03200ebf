"""Reading an inventory file: decoded with msgspec (unknown keys refused, with a guess at what
was meant), then checked (``checks``); a bad file is one ``ConfigError`` line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from console.inventory.checks import cross_check, where
from console.inventory.model import (
    ConsoleSettings,
    Host,
    Inventory,
    Job,
    Placement,
    ProvisionerSettings,
    Region,
)
from console.job_check import check_workload
from protocol.config import _key_path, convert, read_toml
from protocol.errors import ConfigError
from protocol.layouts import expand
from protocol.spec import PLACEMENT_KEYS, JobSpec


class _File(msgspec.Struct, forbid_unknown_fields=True):
    # Values stay ``Any`` here so that a table that is not a table is reported under its own
    # key path (``hosts.NAME``) when it is converted below, not as msgspec's ``hosts[...]``.
    console: dict[str, Any] = {}
    regions: dict[str, Any] = {}
    hosts: dict[str, Any] = {}
    jobs: dict[str, Any] = {}
    provisioner: dict[str, Any] | None = None


def load(path: Path) -> Inventory:
    """Read and validate an inventory; every problem is one ConfigError line."""
    data, text = read_toml(path)
    raw = convert(data, _File, file=path, text=text)

    def typed(table: dict[str, Any], tp: type, keys: list[str]) -> Any:
        return convert(table, tp, file=path, text=text, prefix=keys)

    console = typed(raw.console, ConsoleSettings, ["console"])
    regions = {n: typed(t, Region, ["regions", n]) for n, t in raw.regions.items()}
    hosts = {n: typed(t, Host, ["hosts", n]) for n, t in raw.hosts.items()}
    jobs = {n: _job(n, t, path, text) for n, t in raw.jobs.items()}
    provisioner = (
        None
        if raw.provisioner is None
        else typed(raw.provisioner, ProvisionerSettings, ["provisioner"])
    )
    inv = Inventory(
        path=path,
        console=console,
        regions=regions,
        hosts=hosts,
        jobs=jobs,
        provisioner=provisioner,
    )
    cross_check(inv, text)
    return inv


def _job(name: str, table: dict[str, Any], path: Path, text: str) -> Job:
    keys = ["jobs", name]
    if not isinstance(table, dict):
        raise ConfigError(f"{where(path, text, keys)}: {_key_path(keys)}: expected a table")
    if table.get("name", name) != name:
        raise ConfigError(
            f"{where(path, text, [*keys, 'name'])}: {_key_path([*keys, 'name'])}: "
            "differs from the table's name"
        )
    place = {k: v for k, v in table.items() if k in PLACEMENT_KEYS}
    spec = {
        "name": name,
        **{k: v for k, v in table.items() if k not in PLACEMENT_KEYS and k != "name"},
    }
    job = Job(
        spec=convert(
            expand(spec, file=path, text=text, keys=keys),
            JobSpec,
            file=path,
            text=text,
            prefix=keys,
        ),
        placement=convert(place, Placement, file=path, text=text, prefix=keys),
    )
    check_workload(job.spec, file=path, text=text)
    return job
