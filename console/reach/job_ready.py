"""Is a ``command``-kind job's code and data on a host? ``hotspare check`` asks every host the
job may run on: its ``host`` or a group's ``hosts``, and its ``spares`` (a job that names no
host may start on any). Looked for there: ``cwd``, ``argv[0]``, the script of ``PYTHON
script.py`` or the module of ``PYTHON -m MODULE``, and the ``[command]`` table's ``needs``
(paths) and ``imports`` (modules).

One probe per host (``console/reach/host/job_probe.py``, run with the host's interpreter, the
jobs as one JSON argument, never shell text) prints one JSON line: each problem as (job, key,
what). It only looks; see the probe for how.
"""

from __future__ import annotations

import json
import posixpath
from typing import Any

from console.inventory import Inventory
from console.reach.deploy import job_dir
from console.reach.host import job_probe, source
from console.reach.transport.base import Transport, TransportError

PROBE = source(job_probe)


def hosts_of(inv: Inventory, job: str) -> list[str]:
    """Every host ``job`` may run on: its members and spares (any host, when it names none)."""
    p = inv.jobs[job].placement
    members = inv.members(job)
    if not members:
        return list(inv.hosts)
    return [*members, *(s for s in p.spares if s not in members)]


def jobs_on(inv: Inventory, host: str) -> list[str]:
    """The ``command``-kind jobs that may run on ``host``, in the inventory's order."""
    return [
        name
        for name, job in inv.jobs.items()
        if job.spec.executor == "command"
        and job.spec.command is not None
        and host in hosts_of(inv, name)
    ]


def _order(inv: Inventory, host: str, job: str) -> dict[str, Any]:
    cs = inv.jobs[job].spec.command
    assert cs is not None
    workdir = job_dir(inv.host_root(host), job)
    return {
        "job": job,
        "cwd": posixpath.join(workdir, cs.cwd) if cs.cwd else workdir,
        "check_cwd": cs.cwd is not None,  # the workdir: the executor makes it
        "argv": list(cs.argv),
        "env": {k: v for k, v in cs.env.items() if "{" not in v},
        "needs": list(cs.needs),
        "imports": list(cs.imports),
    }


async def check_jobs(t: Transport, inv: Inventory, host: str) -> list[str]:
    """One line per problem of the jobs that may run on ``host``: ``job J on host H: KEY:
    WHAT``; none when every one's code and data are there (or none may run there).
    ``t`` is connected."""
    jobs = jobs_on(inv, host)
    if not jobs:
        return []
    timeout = inv.console.command_timeout_s
    order = {"timeout": timeout * 0.8, "jobs": [_order(inv, host, j) for j in jobs]}
    python = inv.python(host)
    try:
        result = await t.run([python, "-c", PROBE, json.dumps(order)], timeout=timeout)
    except TransportError as e:
        return [f"job {j} on host {host}: command: not checked: {e}" for j in jobs]
    try:
        problems = json.loads(result.stdout.strip().splitlines()[-1])["problems"]
    except (json.JSONDecodeError, IndexError, KeyError, TypeError):
        tail = (result.stderr.strip().splitlines() or [f"exit {result.returncode}"])[-1]
        what = f"the look for its code and data failed: {tail}"
        return [_printable(f"job {j} on host {host}: command: {what}") for j in jobs]
    return [_printable(f"job {job} on host {host}: {key}: {what}") for job, key, what in problems]


def _printable(line: str) -> str:
    """One line, whatever the paths in it hold: control characters as escapes."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in line)


def on_host(line: str, host: str) -> bool:
    """Whether ``line`` is one of ``check_jobs``'s about ``host`` (it names the host itself)."""
    return line.startswith("job ") and f" on host {host}: " in line


__all__ = ["check_jobs", "hosts_of", "jobs_on", "on_host"]
