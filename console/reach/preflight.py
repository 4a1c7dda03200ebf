"""Preflight of a host: can it run the executor? Python, torch, CUDA, NVML, disk, the bundle.

The probe is a short Python script run with the host's interpreter; it prints one JSON line.
It only looks: a root not made yet is judged by the folder it would be made in, and a bundle
not deployed yet is a note (the console deploys it before it starts an executor), not a
problem.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from console.reach.deploy import Bundle, bundle_dir
from console.reach.host import preflight_probe, source
from console.reach.transport.base import Transport, TransportError
from protocol.units import size_mb

MIN_PYTHON = (3, 11)

PROBE = source(preflight_probe)


@dataclass
class Preflight:
    host: str
    ok: bool = False
    problems: list[str] = field(default_factory=list)
    python: str | None = None
    torch: str | None = None
    cuda_devices: int = 0
    nvml: str | None = None
    disk_free_mb: float | None = None
    bundle: bool = False
    containment: str | None = None
    """What holds every process of a run here: ``cgroup`` (a cgroup v2 per run, killed whole)
    or ``fence`` (the run's fence process alone, a child subreaper)."""
    notes: list[str] = field(default_factory=list)
    """What is worth knowing and is no problem: a bundle the console will deploy itself."""

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


async def preflight(
    t: Transport,
    *,
    root: str,
    python: str,
    bundle: Bundle,
    gpus: int = 0,
    min_free_gb: float = 1.0,
    timeout: float = 60.0,
) -> Preflight:
    """Probe one host; every problem is a sentence in ``problems`` (none means ok)."""
    pf = Preflight(host=t.name)
    try:
        await t.connect()
        result = await t.run([python, "-c", PROBE, root, bundle_dir(root, bundle)], timeout=timeout)
    except TransportError as e:
        pf.problems.append(str(e))
        return pf
    if result.returncode != 0:
        tail = (result.stderr.strip().splitlines() or [f"exit {result.returncode}"])[-1]
        pf.problems.append(f"{python} does not run: {tail}")
        return pf
    try:
        facts = json.loads(result.stdout.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError):
        pf.problems.append(f"the probe printed no result: {result.stdout[:200]!r}")
        return pf
    pf.python, pf.torch, pf.nvml = facts["python"], facts["torch"], facts["nvml"]
    pf.cuda_devices, pf.bundle = facts["cuda_devices"], facts["bundle"]
    pf.containment = facts.get("containment")
    if pf.containment == "fence":
        pf.notes.append(
            f"runs here get no cgroup ({facts.get('containment_why')}): the run's fence process "
            "alone holds them, and preload starts commands with exec instead of forking"
        )
    if facts["disk_free_mb"] is not None:  # to 0.1 MB: the probe's bytes / 2**20 run long
        pf.disk_free_mb = round(facts["disk_free_mb"], 1)
    if tuple(int(x) for x in pf.python.split(".")[:2]) < MIN_PYTHON:
        pf.problems.append(f"python {pf.python} is older than {'.'.join(map(str, MIN_PYTHON))}")
    if pf.torch is None:
        pf.problems.append(f"torch does not import: {facts['torch_error']}")
    if gpus and pf.cuda_devices < gpus:
        pf.problems.append(f"expected {gpus} GPUs, CUDA sees {pf.cuda_devices}")
    if pf.disk_free_mb is None:
        pf.problems.append(f"cannot use {root}: {facts.get('disk_error')}")
    elif pf.disk_free_mb < min_free_gb * 1024:
        pf.problems.append(
            f"only {size_mb(pf.disk_free_mb)} free under {root} "
            f"(need {size_mb(min_free_gb * 1024)}: console.min_free_disk_gb)"
        )
    if not pf.bundle:
        pf.notes.append(
            f"executor bundle {bundle.hash} is not deployed yet: the console deploys it before "
            "it starts an executor here (`hotspare check --deploy` deploys it now)"
        )
    pf.ok = not pf.problems
    return pf
