"""The fault injectors: one function per kind in the fault table, each acting on real parts
(signals to real executors, sshd and its processes killed, a namespace's link downed, bytes
of a checkpoint on disk changed, a tmpfs filled, the console killed, the fake NVML rewritten).

Each returns an ``Injected``: what was done, when, to which job and host, and what the console
is expected to record (the incident classes that count, or none for a blip)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from support.netbed import NsSshHost

from chaos.fleet import FAILING_GPU, HEALTHY_GPU, Fleet
from chaos.observe import events_size
from console.records.journal import Kind
from executors.testing.gpu_fake import write_state

BLIP_S = 0.3
"""A flap's outage: well under the console's suspect_after_s (1 s)."""
UP_S = 0.9
"""A flap's link up between two outages."""


@dataclass
class Injected:
    kind: str
    job: str
    host: str
    t: float
    expect: tuple[str, ...]
    """Incident classes that record this fault; empty: no incident and no failover expected."""
    corrupted: list[tuple[str, str, int]] = field(default_factory=list)
    """(host, data file path, events.jsonl size of the loading workdir at that moment)."""
    damage: dict[str, tuple[str, str]] = field(default_factory=dict)
    """By a path in ``corrupted``: (the sha256 its manifest vouches for, the sha256 of the bytes
    once damaged), as the harness itself read them: that the damage took (chaos.invariants)."""
    heal: Callable[[], None] | None = None
    """Undo what outlives the fault (a dead sshd, a downed link, a full disk, a failing GPU),
    called once the job runs elsewhere or the fault has been seen."""
    note: str = ""
    heal_when: Callable[[], bool] | None = None
    """When ``heal`` may run, if not once the job has recovered (a stepped clock: after some
    leases)."""
    solo: bool = False
    """No other fault may overlap this one (a blip, whose check is that nothing happens)."""
    overlapped: bool = False
    """Another fault of the episode was open while this one was (see invariants.match_incidents)."""
    recovered_at: float | None = None
    """When the job was seen running again with nothing open after this fault."""
    violations: list[str] = field(default_factory=list)
    """What the fault's own checks found (a refused console that was not, a stale step)."""
    inconclusive: list[str] = field(default_factory=list)
    """Checks of this fault that could not be made (its victim gone before the check, the scene
    it needs never set up): never a pass. Counted per kind in the summary, and each one fails
    the run unless the fault was overlapped (see chaos.invariants.inconclusive)."""
    missed: list[str] = field(default_factory=list)
    """Targets it measured and missed (an MTTR bound): counted per kind and listed in the
    summary; a performance target, not a violation of safety: the run does not fail on them."""
    figures: dict[str, float] = field(default_factory=dict)
    """Measurements the summary prints (a restarted console's wait past the lease bound)."""


@dataclass
class Target:
    fleet: Fleet
    job: str
    host: str
    spare: str | None
    rng: random.Random


def live_pid(fleet: Fleet, host: str, job: str) -> int | None:
    """The pid in the workdir's executor.pid, only if that process is an executor serving that
    workdir now (a dead executor's pid may have been given to another process)."""
    workdir = fleet.workdir(host, job)
    try:
        pid = int((workdir / "executor.pid").read_text().strip())
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError):
        return None
    args = [a.decode(errors="replace") for a in argv]
    if "serve" not in args or str(workdir) not in [os.path.normpath(a) for a in args]:
        return None
    return pid


def _pid(fleet: Fleet, host: str, job: str) -> int:
    pid = live_pid(fleet, host, job)
    if pid is None:
        raise AssertionError(f"no live executor of {job} on {host} to signal")
    return pid


def sigkill(t: Target) -> Injected:
    os.kill(_pid(t.fleet, t.host, t.job), signal.SIGKILL)
    return Injected("sigkill", t.job, t.host, time.time(), ("executor_crash",))


def sigstop(t: Target) -> Injected:
    """A hang: the process and its connection stay, heartbeats stop. The console must fence
    and kill it; it is never continued (teardown SIGKILLs whatever is left)."""
    os.kill(_pid(t.fleet, t.host, t.job), signal.SIGSTOP)
    return Injected("sigstop", t.job, t.host, time.time(), ("executor_hang",))


def _restart_sshd(fleet: Fleet, host: str) -> Callable[[], None]:
    def heal() -> None:
        if not fleet.hosts[host].running:
            fleet.hosts[host].start()

    return heal


def host_kill(t: Target) -> Injected:
    t.fleet.hosts[t.host].kill_all()
    return Injected(
        "host_kill", t.job, t.host, time.time(), ("host_lost",), heal=_restart_sshd(t.fleet, t.host)
    )


def partition(t: Target) -> Injected:
    host = t.fleet.hosts[t.host]
    assert isinstance(host, NsSshHost)
    host.netns.cut()
    return Injected("partition", t.job, t.host, time.time(), ("host_lost",), heal=host.netns.heal)


def flap(t: Target) -> Injected:
    """Two short outages of the job's host link: a blip, which must cause no failover."""
    host = t.fleet.hosts[t.host]
    assert isinstance(host, NsSshHost)
    at = time.time()
    for _ in range(2):
        host.netns.cut()
        time.sleep(BLIP_S)  # the fault itself: the link is down this long
        host.netns.heal()
        time.sleep(UP_S)
    return Injected("flap", t.job, t.host, at, ())


def newest_complete(folder: Path) -> Path | None:
    """The newest data file that has its manifest (a complete checkpoint or replica)."""
    done = sorted(p for p in folder.glob("step-*.json"))
    for manifest in reversed(done):
        data = manifest.with_suffix(".pt")
        if data.exists():
            return data
    return None


def _damage(path: Path, rng: random.Random) -> str:
    """Flip bytes in place or truncate (in place: hard links share the damage); how."""
    size = path.stat().st_size
    if rng.random() < 0.5:
        with open(path, "r+b") as f:
            f.truncate(size // 2)
        return f"truncated to {size // 2} of {size} bytes"
    with open(path, "r+b") as f:
        at = rng.randrange(0, max(1, size - 16))
        f.seek(at)
        old = f.read(16)
        f.seek(at)
        f.write(bytes(b ^ 0xFF for b in old))
        f.flush()
        os.fsync(f.fileno())
    return f"16 bytes flipped at offset {at} of {size}"


def _hashes(data: Path) -> tuple[str, str] | None:
    """(the sha256 in ``data``'s manifest, the sha256 of its bytes now); None if unreadable."""
    try:
        vouched = str(json.loads(data.with_suffix(".json").read_bytes())["sha256"])
        return vouched, hashlib.sha256(data.read_bytes()).hexdigest()
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _corrupt(
    inj: Injected, victim: Path | None, host: str, loading: Path, rng: random.Random
) -> None:
    """Damage ``victim`` (to be loaded on ``host`` from ``loading``'s checkpoints) and record it;
    with none, the fault tries no damaged load: an inconclusive."""
    if victim is None:
        inj.inconclusive.append(
            f"{inj.kind}: no complete checkpoint to damage for {host}: no damaged load was tried"
        )
        return
    inj.note = _damage(victim, rng)
    path = str(loading / "checkpoints" / victim.name)  # a replica: where a failover puts it
    inj.corrupted.append((host, path, events_size(loading)))
    hashes = _hashes(victim)
    if hashes is not None:
        inj.damage[path] = hashes


def corrupt_checkpoint(t: Target) -> Injected:
    """Kill the executor, then damage its newest complete checkpoint before the restart loads it."""
    workdir = t.fleet.workdir(t.host, t.job)
    os.kill(_pid(t.fleet, t.host, t.job), signal.SIGKILL)
    at = time.time()
    victim = newest_complete(workdir / "checkpoints")
    inj = Injected("corrupt_checkpoint", t.job, t.host, at, ("executor_crash",))
    _corrupt(inj, victim, t.host, workdir, t.rng)
    return inj


SETTLE_S = 1.5
"""How long corrupt_replica waits for a copy in flight at the host's death to land or fail
(well inside the lease the console waits out before the failover loads)."""


def settled(folder: Path) -> bool:
    """No copy in flight into this replica folder: no part files, every data file's manifest
    in place (a copy streams through the console, so it can land after its source died)."""
    names = {p.name for p in folder.iterdir()} if folder.is_dir() else set()
    if any(n.endswith(".part") for n in names):
        return False
    return all(n[: -len(".pt")] + ".json" in names for n in names if n.endswith(".pt"))


def copied(fleet: Fleet, job: str, source: str, spare: str, at: float) -> bool:
    """The console has said how its copy to ``spare`` of the newest checkpoint ``source``
    reported before ``at`` ended (landed or failed): a copy streams through the console, so it
    can start writing on the spare after its source died (seed 3: a replica landed after the
    one before it was damaged)."""
    events = fleet.journal()
    saved = [
        e.data.get("step", -1)
        for e in events
        if e.kind is Kind.CHECKPOINT and e.job == job and e.host == source and e.t <= at
    ]
    if not saved:
        return True
    newest = max(saved)
    return any(
        e.kind is Kind.REPLICA
        and e.job == job
        and e.host == spare
        and e.data.get("step", -1) >= newest
        for e in events
    )


def corrupt_replica(t: Target) -> Injected:
    """The job's host dies, then its spare's newest replica is damaged before the failover
    (once a copy in flight at the death has landed or been cleared: a newer replica landing
    after the damage left the damaged one untried, an inconclusive; CI seed 3)."""
    assert t.spare is not None
    t.fleet.hosts[t.host].kill_all()
    at = time.time()
    folder = t.fleet.replicas(t.spare, t.job)
    deadline = time.monotonic() + SETTLE_S
    while time.monotonic() < deadline and not (
        settled(folder) and copied(t.fleet, t.job, t.host, t.spare, at)
    ):
        time.sleep(0.05)
    victim = newest_complete(folder)
    inj = Injected(
        "corrupt_replica",
        t.job,
        t.host,
        at,
        ("host_lost",),
        heal=_restart_sshd(t.fleet, t.host),
    )
    _corrupt(inj, victim, t.spare, t.fleet.workdir(t.spare, t.job), t.rng)
    return inj


def disk_full(t: Target) -> Injected:
    """Fill the spare's disk (its tmpfs) to the last byte; healing deletes the filler."""
    assert t.spare is not None
    filler = t.fleet.hosts[t.spare].root / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for size in (1 << 20, 4096, 1):
            with contextlib.suppress(OSError):
                while os.write(fd, b"\0" * size):
                    pass
    finally:
        os.close(fd)

    def heal() -> None:
        filler.unlink(missing_ok=True)

    at = time.time()

    def replica_failed() -> bool:
        """The console has met the full disk: healing sooner would hide it."""
        return any(
            e.kind is Kind.REPLICA and e.host == t.spare and not e.data.get("ok", True)
            for e in t.fleet.journal()
            if e.t >= at
        )

    return Injected(
        "disk_full", t.job, t.spare, at, ("disk_full",), heal=heal, heal_when=replica_failed
    )


def console_restart(t: Target) -> Injected:
    t.fleet.kill_console()
    at = time.time()
    t.fleet.start_console()
    return Injected("console_restart", t.job, t.host, at, ("console_restart",))


def gpu_fail(t: Target) -> Injected:
    nvml = t.fleet.nvml(t.host)
    write_state(nvml, FAILING_GPU)
    return Injected(
        "gpu_fail",
        t.job,
        t.host,
        time.time(),
        ("gpu_fail",),
        heal=lambda: write_state(nvml, HEALTHY_GPU),
    )


INJECTORS: dict[str, Callable[[Target], Injected]] = {
    "sigkill": sigkill,
    "sigstop": sigstop,
    "host_kill": host_kill,
    "partition": partition,
    "flap": flap,
    "corrupt_checkpoint": corrupt_checkpoint,
    "corrupt_replica": corrupt_replica,
    "disk_full": disk_full,
    "console_restart": console_restart,
    "gpu_fail": gpu_fail,
}
ARMED = ("nan", "oom")
"""Faults armed before the run (HOTSPARE_INJECT=nan@STEP,oom@STEP): they fire at a step."""
NEEDS_NAMESPACE = {"partition", "flap"}
NEEDS_REPLICA = {"corrupt_replica", "disk_full"}
KINDS = (*INJECTORS, *ARMED)
