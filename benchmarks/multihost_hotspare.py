"""Multi-host restart, hotspare's side: four sshd hosts in routed namespaces, one SIGKILLed.

a, b and c are the members of a three-host job and d its spare; the console
(``Controller``, ``Policy.AUTO``, the shipped console settings) runs in this process. Two jobs:

- ``hotspare``: ``executor = "command"``, benchmarks/ddp_plain.py under torchrun on each
  member with the static rendezvous the console hands out each epoch, exactly as
  benchmarks/multihost_torchrun.py runs it (same arguments); figures from its step lines.
- ``hotspare-torch``: the built-in torch kind (tests/groupbed.py's three-rank charlm job);
  it writes no step lines, so its figures are the console's (rank 0's Progress).

A host is killed as tests kill one (``SshHost.kill_all``: sshd and every process under its
root). benchmarks/multihost_restart.py runs this beside torchrun and prints both.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "benchmarks")]

import multihost_torchrun as mht  # noqa: E402
import tomli_w  # noqa: E402
from support import netbed, sshbed  # noqa: E402
from support.groupbed import group_job  # noqa: E402

from console.controller import Controller  # noqa: E402
from console.inventory import ConsoleSettings, load  # noqa: E402
from console.records.incidents import incidents  # noqa: E402
from console.records.journal import Kind, read  # noqa: E402
from console.states import JobState  # noqa: E402
from console.supervise.policy import Policy  # noqa: E402

SCENARIOS = ("member", "rank0")
LABEL = {"member": "a non-rank-0 host killed", "rank0": "rank 0's host killed"}
HOSTS = ("a", "b", "c", "d")
MEMBERS, SPARE = ["a", "b", "c"], "d"
VICTIM = {"member": "c", "rank0": "a"}
JOB = "ddp"
STEP_REGEX = r"^step (?P<step>\d+) loss=(?P<loss>[0-9.]+) "
SPLIT = ("to worker start", "worker import", "join + load", "to first step")
PROC = re.compile(r"^proc t0=(?P<t0>[0-9.]+)$")
POLL_S = 0.01
TORCH_KIND = "hotspare, torch kind"
TORCH_KIND_STEPS = 240
"""The torch kind's tiny model steps in milliseconds: more steps, so step 60 is seen in time."""


@dataclass(frozen=True)
class Hotspare:
    start_timeout_s: float = 240.0
    """From the console's start to step ``kill_at``."""
    end_timeout_s: float = 180.0
    """From the kill to the job's end."""

    def describe(self) -> str:
        c = ConsoleSettings()
        return (
            "hotspare: 4 sshd hosts in routed network namespaces (a, b, c members, d the spare), "
            "the console in this process with Policy.AUTO at the shipped settings (lease "
            f"{c.lease_s:g} s, heartbeat {c.heartbeat_s:g} s, suspect after {c.suspect_after_s:g} "
            f"s, clock skew {c.clock_skew_s:g} s), set: only state_dir; executors' env "
            "OMP_NUM_THREADS=1 and GLOO_SOCKET_IFNAME=<the host's one link> (as torchrun's "
            "nodes); executor = command: torchrun --nnodes {nnodes} --node-rank {node_rank} "
            "--master-addr {master_addr} --master-port {master_port} --nproc-per-node "
            "{local_world_size} ddp_plain.py, the same arguments, step lines to "
            "{workdir}/steps.log; TORCH_DISABLE_SHARE_RDZV_TCP_STORE not set (a static "
            "rendezvous always shares the agent's store, and each epoch is a fresh torchrun on "
            "a fresh port); SIGKILL of a host (sshd and every process under its root); "
            f"{TORCH_KIND}: the same hosts and console, the job of tests/groupbed.py "
            f"group_job (charlm tiny, 3 ranks, {TORCH_KIND_STEPS} steps, a checkpoint every "
            "20), executors' env OMP_NUM_THREADS=1, killed once the console saw the step, "
            "its figures from the journal (first step: rank 0's Progress at the console)"
        )


@dataclass
class Restart:
    """One side's figures for one scenario of one trial."""

    side: str
    scenario: str
    trial: int
    killed: str
    killed_step: int
    world_before: int
    seconds: float | None = None
    world_after: int | None = None
    resumed_step: int | None = None
    finished: bool = False
    verdict: str = ""
    phases: dict[str, float] = field(default_factory=dict)
    """hotspare: seconds in each incident phase, the first measured from the kill."""
    console_s: float | None = None
    """hotspare: kill -> the console's first_step mark (rank 0's Progress reached it)."""
    split: dict[str, float] = field(default_factory=dict)
    """Kill -> first step in the parts ``SPLIT`` names, from the step lines."""

    @property
    def survived(self) -> bool:
        return self.seconds is not None


def split(logs: list[Path], kill_t: float) -> dict[str, float]:
    """Kill -> the first step after it, in the parts ``SPLIT`` names, read from the lines of
    the process that logged that step: until it started (before it imported torch), its
    import, joining the group and loading the state (its ``loaded`` line: the slowest rank's
    start shows here), and its first step."""
    lines = [ln for p in logs for ln in mht.read_log(p)]
    began = {
        ln.pid: (float(m["t0"]), ln.t)
        for ln in lines
        if (m := PROC.match(ln.text)) and float(m["t0"]) > kill_t
    }
    fresh = [s for s in mht.steps(lines) if s.pid in began]
    first = min(fresh, key=lambda s: s.t, default=None)
    if first is None:
        return {}
    t0, imported = began[first.pid]
    loaded = [ln.t for ln in lines if ln.pid == first.pid and ln.text.startswith("loaded ")]
    if not loaded:
        return {}
    parts = (t0 - kill_t, imported - t0, loaded[0] - imported, first.t - loaded[0])
    return dict(zip(SPLIT, parts, strict=True))


# ------------------------------------------------------------------ hotspare


def command_job(settings: mht.Settings) -> dict[str, Any]:
    """ddp_plain.py under torchrun on each member, the rendezvous the console's."""
    argv = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes", "{nnodes}",
        "--node-rank", "{node_rank}", "--master-addr", "{master_addr}",
        "--master-port", "{master_port}", "--nproc-per-node", "{local_world_size}",
        str(mht.SCRIPT), "--checkpoint-dir", "{checkpoint_dir}",
        "--step-log", "{workdir}/steps.log", *settings.script_args(),
    ]  # fmt: skip
    return {
        "hosts": list(MEMBERS),
        "spares": [SPARE],
        "executor": "command",
        "steps": settings.steps,
        "checkpoint_every_steps": settings.save_every,
        "command": {
            "argv": argv,
            "checkpoint_glob": "ckpt-*.pt",
            "complete_marker": "{name}.done",
            "progress_regex": STEP_REGEX,
        },
    }


def write_inventory(folder: Path, hosts: dict[str, netbed.NsSshHost], job: dict[str, Any]) -> Path:
    table = {
        n: h.inventory_table("r1", **({"role": "spare"} if n == SPARE else {}))
        for n, h in hosts.items()
    }
    data = {
        "console": {"state_dir": str(folder / "state")},
        "regions": {"r1": {"priority": 1}},
        "hosts": table,
        "jobs": {JOB: job},
    }
    path = folder / "inventory.toml"
    path.write_text(tomli_w.dumps(data))
    return path


def step_log(host: sshbed.SshHost) -> Path:
    return host.root / "jobs" / JOB / "steps.log"


async def _wait(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} within {timeout:g} s")
        await asyncio.sleep(POLL_S)


def _first_after(logs: list[Path], kill_t: float, before: set[int]) -> mht.Line | None:
    fresh = [
        s
        for log in logs
        for s in mht.steps(mht.read_log(log))
        if s.t > kill_t and s.pid not in before
    ]
    return min(fresh, key=lambda s: s.t, default=None)


@dataclass
class Bed:
    """One hotspare scenario's fleet: its hosts and the console running the job."""

    ctl: Controller
    task: asyncio.Task[Any]
    hosts: dict[str, netbed.NsSshHost]
    settings: mht.Settings
    hs: Hotspare

    async def kill(self, host: str) -> float:
        """SIGKILL ``host``: its sshd and every process under its root; the time just before."""
        t = time.time()
        await asyncio.to_thread(self.hosts[host].kill_all)
        return t

    async def until_end(self) -> None:
        await asyncio.wait({self.task}, timeout=self.hs.end_timeout_s)

    def journal_figures(self, out: Restart, kill_t: float) -> None:
        """The incident's phases (from the kill) and verdict into ``out``."""
        sup = self.ctl.jobs[JOB]
        out.finished = sup.state is JobState.FINISHED
        found = incidents(read(self.ctl.inv.state_dir / "journal.jsonl"))
        if found:
            inc = found[0]
            inc.fault_at = kill_t
            out.phases = inc.breakdown()
            if inc.resolved:
                out.console_s = inc.times["first_step"] - kill_t
        members = ", ".join(self.ctl.store.job(JOB).members)
        state = f"{sup.state.value}: {sup.live.why}"
        if out.seconds is not None:
            end = "ran to the end" if out.finished else f"did not finish ({state})"
            out.verdict = (
                f"first step after {out.seconds:.2f} s at world size {out.world_after} on "
                f"{members}; {end}"
            )
        elif self.task.done():
            out.verdict = f"job ended without a step after the kill: {state}"
        else:
            out.verdict = f"job stuck: no step within {self.hs.end_timeout_s:g} s ({state})"


async def hotspare_scenario(
    side: str, scenario: str, trial: int, folder: Path, settings: mht.Settings, hs: Hotspare
) -> Restart:
    """``side``: ``hotspare`` (the command kind, torchrun) or ``hotspare-torch`` (torch kind)."""
    folder.mkdir(parents=True)
    with sshbed.ssh_bed(folder / "bed") as bed:
        hosts = {n: netbed.ns_host(bed, n, routed=True) for n in HOSTS}
        env = {n: {"OMP_NUM_THREADS": "1"} for n in hosts}
        if side == "hotspare":
            job = command_job(settings)
            # as torchrun's nodes: gloo on the host's one link (the torch kind finds it itself)
            for n, h in hosts.items():
                env[n]["GLOO_SOCKET_IFNAME"] = h.netns.inside
        else:
            job = group_job(steps=TORCH_KIND_STEPS, checkpoint_every_steps=settings.save_every)
        ctl = Controller(load(write_inventory(folder, hosts, job)), Policy.AUTO, executor_env=env)
        task = asyncio.create_task(ctl.run())
        b = Bed(ctl, task, hosts, settings, hs)
        try:
            if side == "hotspare":
                return await _drive_command(b, scenario, trial)
            return await _drive_torch_kind(b, scenario, trial)
        finally:
            if not task.done():
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await ctl.close()


async def _drive_command(b: Bed, scenario: str, trial: int) -> Restart:
    """Kill once a step line says ``kill_at``; the figures from the survivors' step lines."""
    sup, kill_at = b.ctl.jobs[JOB], b.settings.kill_at
    logs = {n: step_log(h) for n, h in b.hosts.items()}

    def reached() -> bool:
        done = (mht.step_of(s) for p in logs.values() for s in mht.steps(mht.read_log(p)))
        return any(step >= kill_at for step in done)

    await _wait(lambda: b.task.done() or reached(), b.hs.start_timeout_s, f"step {kill_at}")
    if b.task.done():
        raise RuntimeError(f"the job ended before step {kill_at}: {sup.live.why}")
    victim = VICTIM[scenario]
    lines = {n: mht.read_log(p) for n, p in logs.items()}
    before = {ln.pid for ls in lines.values() for ln in ls}
    mine = mht.steps(lines[victim])
    kill_t = await b.kill(victim)
    rank = mine[-1].field("rank") if mine else None
    out = Restart(
        "hotspare", scenario, trial, f"{victim} (rank {rank})",
        max((mht.step_of(s) for s in mine), default=0),
        max((s.field("world") or 0 for ls in lines.values() for s in mht.steps(ls)), default=0),
    )  # fmt: skip
    await b.until_end()
    others = [p for n, p in logs.items() if n != victim]
    if first := _first_after(others, kill_t, before):
        out.seconds, out.world_after = first.t - kill_t, first.field("world")
        loaded = [
            ln for p in others for ln in mht.read_log(p)
            if ln.pid == first.pid and ln.text.startswith("loaded ")
        ]  # fmt: skip
        out.resumed_step = loaded[-1].field("step") if loaded else None
    out.split = split(others, kill_t)
    b.journal_figures(out, kill_t)
    return out


async def _drive_torch_kind(b: Bed, scenario: str, trial: int) -> Restart:
    """Kill once the console saw step ``kill_at``; the figures from the journal (the torch kind
    writes no step lines): the first step is rank 0's Progress as the console got it."""
    sup, kill_at = b.ctl.jobs[JOB], b.settings.kill_at
    seen = lambda: b.task.done() or sup.step >= kill_at  # noqa: E731
    await _wait(seen, b.hs.start_timeout_s, f"step {kill_at}")
    if b.task.done():
        raise RuntimeError(f"the job ended before step {kill_at}: {sup.live.why}")
    victim = VICTIM[scenario]
    step = sup.step
    kill_t = await b.kill(victim)
    killed = f"{victim} (rank {MEMBERS.index(victim)})"
    out = Restart(TORCH_KIND, scenario, trial, killed, step, len(MEMBERS))
    await b.until_end()
    b.journal_figures(out, kill_t)
    epochs = [
        e.data for e in read(b.ctl.inv.state_dir / "journal.jsonl")
        if e.kind is Kind.EXECUTOR and e.data.get("epoch", 0) > 1 and "members" in e.data
    ]  # fmt: skip
    if out.console_s is not None:
        out.seconds = out.console_s
        out.world_after = len(epochs[0]["members"]) if epochs else None
        found = incidents(read(b.ctl.inv.state_dir / "journal.jsonl"))
        out.resumed_step = found[0].resumed_step if found else None
        b.journal_figures(out, kill_t)  # the verdict again, now with the figures
    return out


def measure(
    side: str,
    settings: mht.Settings,
    hs: Hotspare,
    trials: int,
    folder: Path,
    scenarios: tuple[str, ...],
) -> list[Restart]:
    found = []
    for r in range(trials):
        for scenario in scenarios:
            t0 = time.monotonic()
            where = folder / f"{scenario}-{r}"
            out = asyncio.run(hotspare_scenario(side, scenario, r + 1, where, settings, hs))
            found.append(out)
            print(
                f"trial {r + 1}: {out.side}, {LABEL[scenario]}: {out.verdict} "
                f"({time.monotonic() - t0:.0f} s)",
                file=sys.stderr,
                flush=True,
            )
    return found
