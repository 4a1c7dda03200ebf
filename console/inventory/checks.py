"""What a schema cannot say of an inventory: names that must refer to something, per-transport
rules, and what each kind of job may be placed on; every problem one ``ConfigError`` line naming
the file, key path and line."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import msgspec

from console.inventory.model import ETCD_ENDPOINT, Host, Inventory, Job
from protocol.config import _key_path, _one_line, find_line
from protocol.errors import ConfigError
from protocol.spec import JOB_NAME_PATTERN
from protocol.workdirs import job_dir, too_long


def where(path: Path, text: str, keys: list[str]) -> str:
    line = find_line(text, keys)
    return f"{path}:{line}" if line else str(path)


def fail(inv: Inventory, text: str, keys: list[str], what: str) -> None:
    raise ConfigError(f"{where(inv.path, text, keys)}: {_key_path(keys)}: {_one_line(what)}")


def _known(kind: str, name: str, known: dict[str, Any]) -> str:
    have = ", ".join(sorted(known)) or "none"
    return f"unknown {kind} {name!r} (have: {have})"


def cross_check(inv: Inventory, text: str) -> None:
    """What a schema cannot say: names that must refer to something, and per-transport rules."""
    for i, endpoint in enumerate(inv.console.etcd):
        if not re.fullmatch(ETCD_ENDPOINT, endpoint):
            fail(
                inv,
                text,
                ["console", "etcd"],
                f"etcd[{i}] {endpoint!r} is not HOST:PORT or http(s)://HOST:PORT",
            )
    if inv.console.etcd and inv.console.leader_ttl_s >= inv.console.lease_s:
        fail(
            inv,
            text,
            ["console", "etcd_ttl_s" if inv.console.etcd_ttl_s is not None else "lease_s"],
            f"the leader's etcd lease ({inv.console.leader_ttl_s:g} s) must be shorter than "
            f"lease_s ({inv.console.lease_s:g} s): a standby takes over before leases end",
        )
    for table, kind, names in (("hosts", "host", inv.hosts), ("regions", "region", inv.regions)):
        for name in names:
            if not re.fullmatch(JOB_NAME_PATTERN, name):
                what = f"a {kind} name may hold only letters, digits, '.', '_' and '-'"
                fail(inv, text, [table, name], what)
    if inv.provisioner is not None:
        for region in inv.provisioner.min_spares:
            if region not in inv.regions:
                keys = ["provisioner", "min_spares", region]
                fail(inv, text, keys, _known("region", region, inv.regions))
    for name, host in inv.hosts.items():
        keys = ["hosts", name]
        if host.region not in inv.regions:
            fail(inv, text, [*keys, "region"], _known("region", host.region, inv.regions))
        if host.address and host.addresses:
            fail(inv, text, [*keys, "addresses"], "give `address` or `addresses`, not both")
        if host.transport == "ssh" and not host.all_addresses():
            fail(inv, text, keys, "an ssh host needs `address` or `addresses`")
        if host.transport == "local" and (host.all_addresses() or host.port or host.proxy_jump):
            fail(inv, text, keys, "a local host takes no address, port or proxy_jump")
        if not host.root.strip():
            fail(inv, text, [*keys, "root"], "must not be empty")
        for field in msgspec.structs.fields(Host):
            value = getattr(host, field.name)
            values = value if isinstance(value, list) else [value]
            if any(isinstance(v, str) and "\0" in v for v in values):
                # No argv, path or ssh option can hold one; it would fail later as a traceback.
                fail(inv, text, [*keys, field.name], "must not contain a NUL character")
        if host.transport == "local":
            try:
                inv.host_root(name)
            except (RuntimeError, ValueError, OSError) as e:
                fail(inv, text, [*keys, "root"], f"not a usable folder on this machine: {e}")
        _check_socket_paths(inv, text, name)
    for name, job in inv.jobs.items():
        keys = ["jobs", name]
        p = job.placement
        if p.host is not None and p.host not in inv.hosts:
            fail(inv, text, [*keys, "host"], _known("host", p.host, inv.hosts))
        if p.host is not None and p.hosts:
            fail(inv, text, [*keys, "hosts"], "give `host` or `hosts`, not both")
        if len(p.hosts) == 1:
            fail(inv, text, [*keys, "hosts"], "a job on one host says `host = ...`")
        for member in p.hosts:
            if member not in inv.hosts:
                fail(inv, text, [*keys, "hosts"], _known("host", member, inv.hosts))
        if len(set(p.hosts)) != len(p.hosts):
            fail(inv, text, [*keys, "hosts"], "a host is named twice")
        if p.hosts and p.warm_twin:
            fail(inv, text, keys, "warm_twin is for jobs on one host for now")
        _check_procs(inv, text, keys, job)
        _check_elastic(inv, text, keys, job)
        _check_parallel(inv, text, keys, job)
        if p.hosts and job.spec.executor not in ("torch", "command"):
            fail(inv, text, [*keys, "hosts"], "only the torch and command kinds span hosts")
        if p.region is not None and p.region not in inv.regions:
            fail(inv, text, [*keys, "region"], _known("region", p.region, inv.regions))
        for spare in p.spares:
            if spare not in inv.hosts:
                fail(inv, text, [*keys, "spares"], _known("host", spare, inv.hosts))
            if spare == p.host or spare in p.hosts:
                fail(inv, text, [*keys, "spares"], f"{spare!r} is one of the job's own hosts")


def _check_socket_paths(inv: Inventory, text: str, name: str) -> None:
    """Every job's executor sockets fit under host ``name``'s root (any job may fail over to
    any host). A root the host expands (``~``, relative) is left to the executor's own check,
    which fails the job at once with this reason."""
    root = inv.host_root(name)
    if not root.startswith("/"):
        return
    for job in inv.jobs:
        why = too_long(job_dir(root, job))
        if why is not None:
            fail(
                inv,
                text,
                ["hosts", name, "root"],
                f"too deep for job {job!r}: {why}; use a shorter root",
            )


def _check_procs(inv: Inventory, text: str, keys: list[str], job: Job) -> None:
    """The torch kind's ``procs_per_host``: over several hosts, one GPU per rank on a GPU host."""
    p = job.placement
    procs = p.procs_per_host or 1
    if procs < 2 or job.spec.executor != "torch":
        return
    where = [*keys, "procs_per_host"]
    if not p.hosts:
        fail(
            inv,
            text,
            where,
            "the torch kind runs more than one rank per host in a job on several `hosts` for "
            "now (one host trains one rank)",
        )
    for h in [*p.hosts, *p.spares]:
        gpus = inv.hosts[h].gpus if h in inv.hosts else 0
        if 0 < gpus < procs:
            fail(
                inv,
                text,
                where,
                f"{procs} ranks per host take a GPU each; host {h} has {gpus} (or set "
                f"procs_per_host = {gpus})",
            )


def _check_parallel(inv: Inventory, text: str, keys: list[str], job: Job) -> None:
    """``parallel = "fsdp"``: the torch kind's, over several hosts, with the plain reduce."""
    if job.spec.parallel == "ddp":
        return
    where = [*keys, "parallel"]
    if job.spec.executor != "torch":
        fail(inv, text, where, "fsdp is the torch kind's (a command shards its model itself)")
    if not job.placement.hosts:
        fail(inv, text, where, "fsdp shards the model over a job's `hosts` (two or more)")
    if job.placement.deterministic_reduce:
        fail(
            inv,
            text,
            where,
            "fsdp reduce-scatters in an order that cannot be fixed: deterministic_reduce needs "
            'parallel = "ddp"',
        )


def _check_elastic(inv: Inventory, text: str, keys: list[str], job: Job) -> None:
    p = job.placement
    elastic = {
        k: v
        for k, v in (
            ("min_hosts", p.min_hosts),
            ("logical_ranks", p.logical_ranks),
            ("deterministic_reduce", p.deterministic_reduce or None),
        )
        if v is not None
    }
    if not elastic:
        return
    key = next(iter(elastic))
    if not p.hosts:
        fail(inv, text, [*keys, key], "elastic keys are for a job on several `hosts`")
    if job.spec.executor != "torch":
        fail(
            inv,
            text,
            [*keys, key],
            "elastic jobs are the torch kind's for now (it keeps the global batch itself)",
        )
    if p.min_hosts is not None and p.min_hosts > len(p.hosts):
        fail(
            inv, text, [*keys, "min_hosts"], f"{p.min_hosts} is more than the {len(p.hosts)} hosts"
        )
    if p.logical_ranks is not None and p.logical_ranks < len(p.hosts):
        fail(
            inv,
            text,
            [*keys, "logical_ranks"],
            f"{p.logical_ranks} is fewer than the {len(p.hosts)} hosts (each runs one at least)",
        )
