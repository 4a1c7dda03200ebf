"""``hotspare check``: validate the inventory, reach every host, and preflight it.

``--json`` prints one object, the same shape whether the check ran or the inventory was
refused, so a script reads one key to know how it went::

    {"ok": true, "error": null, "hosts": [{"host": "a", "ok": true, "problems": [], ...}]}
    {"ok": false, "error": "inventory.toml: hosts.a.role: ...", "hosts": []}

``ok`` is true when every host passed (exit 0); ``error`` is the one line that stopped the
check before any host was reached (exit 2), else null; ``hosts`` holds each host's preflight.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from dataclasses import dataclass, field
from typing import TextIO

from console.inventory import Inventory
from console.reach.deploy import build_bundle, deploy
from console.reach.job_ready import check_jobs, on_host
from console.reach.preflight import Preflight, preflight
from console.reach.transport.base import TransportError
from console.reach.transport.factory import open_transport
from protocol.units import size_mb


async def check_host(inv: Inventory, name: str, *, do_deploy: bool) -> Preflight:
    host = inv.hosts[name]
    root = inv.host_root(name)
    bundle = build_bundle()
    t = open_transport(inv, name)
    try:
        if do_deploy:
            try:
                await t.connect()
                await deploy(t, root, inv.python(name), bundle)
            except TransportError as e:
                return Preflight(host=name, problems=[str(e)])
        pf = await preflight(
            t,
            root=root,
            python=inv.python(name),
            bundle=bundle,
            gpus=host.gpus,
            min_free_gb=inv.console.min_free_disk_gb,
            timeout=inv.console.command_timeout_s,
        )
        if pf.python is not None:  # its python runs: are the jobs' code and data here too?
            pf.problems.extend(await check_jobs(t, inv, name))
            pf.ok = not pf.problems
        return pf
    finally:
        await t.close()


@dataclass
class Readied:
    """A new host made ready before the fleet uses it: its problems (none: ready) and what
    each step cost."""

    problems: list[str] = field(default_factory=list)
    preflight_s: float = 0.0
    deploy_s: float = 0.0


async def ready_host(inv: Inventory, name: str) -> Readied:
    """Preflight a host the fleet does not use yet (``inv`` has its table) and, when it
    passes, deploy the executor bundle there, so its first executor starts without an upload."""
    host, root, python = inv.hosts[name], inv.host_root(name), inv.python(name)
    bundle = build_bundle()
    t = open_transport(inv, name)
    out = Readied()
    try:
        t0 = time.monotonic()
        pf = await preflight(
            t,
            root=root,
            python=python,
            bundle=bundle,
            gpus=host.gpus,
            min_free_gb=inv.console.min_free_disk_gb,
            timeout=inv.console.command_timeout_s,
        )
        out.preflight_s = time.monotonic() - t0
        if not pf.ok:
            out.problems = pf.problems
            return out
        t0 = time.monotonic()
        try:
            async with asyncio.timeout(inv.console.command_timeout_s):
                await deploy(t, root, python, bundle)
        except TimeoutError:
            out.problems.append(
                f"deploying the executor took over {inv.console.command_timeout_s:g} s"
            )
        except TransportError as e:
            out.problems.append(f"deploying the executor failed: {e}")
        out.deploy_s = time.monotonic() - t0
        return out
    finally:
        await t.close()


async def check_all(inv: Inventory, *, do_deploy: bool = False) -> list[Preflight]:
    return list(await asyncio.gather(*(check_host(inv, n, do_deploy=do_deploy) for n in inv.hosts)))


def render(inv: Inventory, results: list[Preflight], out: TextIO) -> None:
    rows = [
        (
            *("HOST", "REGION", "TRANSPORT", "PYTHON", "TORCH", "GPUS", "DISK FREE", "BUNDLE"),
            *("RUNS IN", "STATUS"),
        )
    ]
    for r in results:
        host = inv.hosts[r.host]
        disk = size_mb(r.disk_free_mb) if r.disk_free_mb is not None else "-"
        rows.append(
            (
                r.host,
                host.region,
                host.transport,
                r.python or "-",
                r.torch or "-",
                str(r.cuda_devices),
                disk,
                "yes" if r.bundle else "no",
                r.containment or "-",
                "ok" if r.ok else "FAIL",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        out.write(
            "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() + "\n"
        )
    for r in results:
        for problem in r.problems:
            named = problem.startswith(f"{r.host}: ") or on_host(problem, r.host)
            out.write(problem if named else f"{r.host}: {problem}")
            out.write("\n")
    for r in results:
        for note in r.notes:
            out.write(f"{r.host}: note: {note}\n")


def as_document(results: list[Preflight], error: str | None = None) -> dict[str, object]:
    """What ``--json`` prints: one shape on success and on error (the module says which)."""
    return {
        "ok": error is None and all(r.ok for r in results),
        "error": error,
        "hosts": [r.as_dict() for r in results],
    }


def write_json(out: TextIO, results: list[Preflight], error: str | None = None) -> None:
    out.write(json.dumps(as_document(results, error), indent=2) + "\n")


def run_check(inv: Inventory, *, as_json: bool, do_deploy: bool, out: TextIO | None = None) -> int:
    """``out``: default the ``sys.stdout`` of the call, not of the import."""
    out = sys.stdout if out is None else out
    results = asyncio.run(check_all(inv, do_deploy=do_deploy))
    if as_json:
        write_json(out, results)
    else:
        render(inv, results, out)
    return 0 if all(r.ok for r in results) else 1
