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
from console.reach.transport.base import Transport, TransportError
from protocol.units import size_mb

MIN_PYTHON = (3, 11)

_PROBE = r"""
import json, os, shutil, sys
out = {"python": "%d.%d.%d" % sys.version_info[:3], "torch": None, "torch_error": None,
       "cuda": False, "cuda_devices": 0, "nvml": None, "disk_free_mb": None,
       "bundle": os.path.exists(os.path.join(sys.argv[2], ".complete"))}
try:  # creates nothing: a root not made yet is judged by the folder it will be made in
    here = os.path.abspath(sys.argv[1])
    while not os.path.isdir(here):
        if os.path.lexists(here):
            raise NotADirectoryError("%s is not a folder" % here)
        here = os.path.dirname(here)
    if not os.access(here, os.W_OK | os.X_OK):
        raise PermissionError("%s is not writable" % here)
    out["disk_free_mb"] = shutil.disk_usage(here).free / 2**20
except OSError as e:
    out["disk_error"] = str(e)
try:
    import torch
    out["torch"] = torch.__version__
    out["cuda"] = bool(torch.cuda.is_available())
    out["cuda_devices"] = torch.cuda.device_count() if out["cuda"] else 0
except Exception as e:
    out["torch_error"] = "%s: %s" % (type(e).__name__, e)
try:  # where runs get a cgroup of their own (executors/fencing/cgroup.py: keep in step)
    mount = None
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            if right.split()[:1] == ["cgroup2"]:
                mount = left.split()[4]
    if mount is None:
        raise OSError("no cgroup v2 hierarchy is mounted")
    with open("/proc/self/cgroup") as f:
        own = [l[3:].strip() for l in f if l.startswith("0::")]
    here = os.path.normpath(os.path.join(mount, own[0].lstrip("/"))) if own else mount
    if not os.access(here, os.W_OK):
        raise OSError("%s is not writable by this user (no delegated cgroup)" % here)
    if here != mount and not os.path.exists(os.path.join(here, "cgroup.kill")):
        raise OSError("the kernel has no cgroup.kill (Linux 5.14 or later)")
    out["containment"] = "cgroup"
except OSError as e:
    out["containment"] = "fence"
    out["containment_why"] = str(e)
try:
    import pynvml
    pynvml.nvmlInit()
    out["nvml"] = "ok: %d GPUs" % pynvml.nvmlDeviceGetCount()
except Exception as e:
    out["nvml"] = "no GPU (%s)" % (str(e) or type(e).__name__)
print(json.dumps(out))
"""


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
        result = await t.run(
            [python, "-c", _PROBE, root, bundle_dir(root, bundle)], timeout=timeout
        )
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
