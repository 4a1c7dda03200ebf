"""Multi-host restart, side by side in one run: torchrun with a standby node, hotspare with a spare.

Both sides train THE SAME script, benchmarks/ddp_plain.py, with the same arguments (steps,
step time, a checkpoint every 20 steps), four hosts in routed network namespaces, and each
SIGKILLs one host once step ``--kill-at`` is done:

- torchrun: benchmarks/multihost_torchrun.py as it is (``torchrun --nnodes 3:4``, c10d store
  on node 0, four agents); ``member`` kills node 3, ``rank0`` node 0 (the store's host).
- hotspare: four sshd hosts (a, b, c the members, d the spare) and the console
  (``Controller``, ``Policy.AUTO``) in this process, at the shipped console settings. The job
  has ``executor = "command"``: on each member host its executor runs torchrun with the
  static rendezvous the console hands out each epoch (``--nnodes {nnodes} --node-rank
  {node_rank} --master-addr {master_addr} --master-port {master_port}``). ``member`` kills c
  (node rank 2), ``rank0`` kills a: its sshd and every process under its root
  (``SshHost.kill_all``).

Figure, read the same way on both sides: seconds from the kill (taken just before it) to the
first step line a process started after the kill wrote (the script's own ``time.time()``),
the world size on that line, and whether the job ran to its end. For hotspare the incident's
phases come from the console's journal (``console/records/incidents.py``), from the kill.

    python benchmarks/multihost_restart.py [--trials 3] [--quick] [--json] [--keep DIR]
        [--only member,rank0] [--torchrun-defaults]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import re
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "benchmarks")]

import multihost_torchrun as mht  # noqa: E402
import netbed  # noqa: E402
import sshbed  # noqa: E402
import tomli_w  # noqa: E402
from common import Figure, at_least, at_most, emit  # noqa: E402

from console.inventory import ConsoleSettings, load  # noqa: E402
from console.jobs.controller import Controller  # noqa: E402
from console.jobs.policy import Policy  # noqa: E402
from console.records.incidents import incidents  # noqa: E402
from console.records.journal import read  # noqa: E402
from console.states import JobState  # noqa: E402

SCENARIOS = ("member", "rank0")
LABEL = {"member": "a non-rank-0 host killed", "rank0": "rank 0's host killed"}
TORCHRUN_SCENARIO = {"member": "worker", "rank0": "store"}
HOSTS = ("a", "b", "c", "d")
MEMBERS, SPARE = ["a", "b", "c"], "d"
VICTIM = {"member": "c", "rank0": "a"}
JOB = "ddp"
TORCHRUN_DEFAULT_S = 57.6
"""torchrun --nnodes 2:4 at its default rendezvous timeouts, a non-store node killed (issue 15)."""
SPEEDUP = 5.0
GRACE_S = 2.0
"""The goal: back at the same world size within lease_s + this."""
PHASES = ("detect", "decide", "transfer", "start", "load", "first step")
STEP_REGEX = r"^step (?P<step>\d+) loss=(?P<loss>[0-9.]+) "
SPLIT = ("to worker start", "worker import", "join + load", "to first step")
POLL_S = 0.01
PROC = re.compile(r"^proc t0=(?P<t0>[0-9.]+)$")


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
            "a fresh port); SIGKILL of a host (sshd and every process under its root)"
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


def from_torchrun(o: mht.Outcome, trial: int, folder: Path) -> Restart:
    """``folder``: where ``mht.measure`` ran this trial (its nodes' logs)."""
    rank = "" if o.killed_rank is None else f" (rank {o.killed_rank})"
    scenario = next(s for s, t in TORCHRUN_SCENARIO.items() if t == o.scenario)
    nodes = sorted((folder / f"{o.scenario}-0").glob("node*"))
    logs = [n / "steps.log" for n in nodes if n.name != f"node{o.killed_node}"]
    return Restart(
        "torchrun", scenario, trial, f"node {o.killed_node}{rank}", o.killed_step,
        o.world_before, o.seconds, o.world_after, o.resumed_step, o.finished, mht.verdict(o),
        split=split(logs, o.kill_t),
    )  # fmt: skip


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


def write_inventory(
    folder: Path, hosts: dict[str, netbed.NsSshHost], settings: mht.Settings
) -> Path:
    argv = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes", "{nnodes}",
        "--node-rank", "{node_rank}", "--master-addr", "{master_addr}",
        "--master-port", "{master_port}", "--nproc-per-node", "{local_world_size}",
        str(mht.SCRIPT), "--checkpoint-dir", "{checkpoint_dir}",
        "--step-log", "{workdir}/steps.log", *settings.script_args(),
    ]  # fmt: skip
    job = {
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


async def hotspare_scenario(
    scenario: str, trial: int, folder: Path, settings: mht.Settings, hs: Hotspare
) -> Restart:
    folder.mkdir(parents=True)
    with sshbed.ssh_bed(folder / "bed") as bed:
        indices = netbed.free_indices(len(HOSTS))
        hosts = {n: netbed.ns_host(bed, i, n, routed=True) for n, i in zip(HOSTS, indices, strict=True)}  # fmt: skip
        inv = write_inventory(folder, hosts, settings)
        env = {n: {"OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": h.netns.inside} for n, h in hosts.items()}  # fmt: skip
        ctl = Controller(load(inv), Policy.AUTO, executor_env=env)
        task = asyncio.create_task(ctl.run())
        try:
            return await _drive(ctl, task, hosts, scenario, trial, settings, hs)
        finally:
            if not task.done():
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await ctl.close()


async def _drive(
    ctl: Controller,
    task: asyncio.Task[Any],
    hosts: dict[str, netbed.NsSshHost],
    scenario: str,
    trial: int,
    settings: mht.Settings,
    hs: Hotspare,
) -> Restart:
    sup = ctl.jobs[JOB]
    logs = {n: step_log(h) for n, h in hosts.items()}

    def reached() -> bool:
        return any(
            mht.step_of(s) >= settings.kill_at for p in logs.values() for s in mht.steps(mht.read_log(p))
        )  # fmt: skip

    await _wait(lambda: task.done() or reached(), hs.start_timeout_s, f"step {settings.kill_at}")
    if task.done():
        raise RuntimeError(f"the job ended before step {settings.kill_at}: {sup.live.why}")
    victim = VICTIM[scenario]
    lines = {n: mht.read_log(p) for n, p in logs.items()}
    before = {ln.pid for ls in lines.values() for ln in ls}
    mine = mht.steps(lines[victim])
    kill_t = time.time()
    await asyncio.to_thread(hosts[victim].kill_all)
    rank = mine[-1].field("rank") if mine else None
    out = Restart(
        "hotspare", scenario, trial, f"{victim} (rank {rank})",
        max((mht.step_of(s) for s in mine), default=0),
        max((s.field("world") or 0 for ls in lines.values() for s in mht.steps(ls)), default=0),
    )  # fmt: skip
    await asyncio.wait({task}, timeout=hs.end_timeout_s)
    others = [p for n, p in logs.items() if n != victim]
    if first := _first_after(others, kill_t, before):
        out.seconds, out.world_after = first.t - kill_t, first.field("world")
        loaded = [
            ln for p in others for ln in mht.read_log(p)
            if ln.pid == first.pid and ln.text.startswith("loaded ")
        ]  # fmt: skip
        out.resumed_step = loaded[-1].field("step") if loaded else None
    out.finished = sup.state is JobState.FINISHED
    out.split = split(others, kill_t)
    found = incidents(read(ctl.inv.state_dir / "journal.jsonl"))
    if found:
        inc = found[0]
        inc.fault_at = kill_t
        out.phases = inc.breakdown()
        if inc.resolved:
            out.console_s = inc.times["first_step"] - kill_t
    members = ", ".join(ctl.store.job(JOB).members)
    if out.seconds is not None:
        end = (
            "ran to the end"
            if out.finished
            else f"did not finish ({sup.state.value}: {sup.live.why})"
        )
        out.verdict = f"first step after {out.seconds:.2f} s at world size {out.world_after} on {members}; {end}"  # fmt: skip
    elif task.done():
        out.verdict = f"job ended without a step after the kill: {sup.state.value}: {sup.live.why}"
    else:
        out.verdict = f"job stuck: no step within {hs.end_timeout_s:g} s ({sup.state.value})"
    return out


def measure_hotspare(
    settings: mht.Settings, hs: Hotspare, trials: int, folder: Path, scenarios: tuple[str, ...]
) -> list[Restart]:
    found = []
    for r in range(trials):
        for scenario in scenarios:
            t0 = time.monotonic()
            where = folder / f"{scenario}-{r}"
            out = asyncio.run(hotspare_scenario(scenario, r + 1, where, settings, hs))
            found.append(out)
            print(
                f"trial {r + 1}: hotspare, {LABEL[scenario]}: {out.verdict} "
                f"({time.monotonic() - t0:.0f} s)",
                file=sys.stderr,
                flush=True,
            )
    return found


# ------------------------------------------------------------------- output


def _ratio(torchrun: Restart | None, hotspare: Restart) -> str:
    if torchrun is None:
        return ""
    if torchrun.seconds is not None and hotspare.seconds:
        return f"{torchrun.seconds / hotspare.seconds:.1f}x"
    if torchrun.seconds is None and hotspare.seconds is not None:
        return "torchrun's job died"
    return "-"


def table(found: list[Restart]) -> str:
    rows = [
        "| scenario | side | killed | at step | kill -> first step | world | resumed from "
        "| outcome | torchrun / hotspare |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    key = {s: i for i, s in enumerate(SCENARIOS)}
    for r in sorted(found, key=lambda r: (key[r.scenario], r.trial, r.side != "torchrun")):
        pair = next(
            (t for t in found if (t.side, t.scenario, t.trial) == ("torchrun", r.scenario, r.trial)),
            None,
        )  # fmt: skip
        secs = "" if r.seconds is None else f"{r.seconds:.2f} s"
        world = f"{r.world_before} -> {r.world_after or '-'}"
        resumed = "" if r.resumed_step is None else str(r.resumed_step)
        ratio = _ratio(pair, r) if r.side == "hotspare" else ""
        rows.append(
            f"| {LABEL[r.scenario]} (trial {r.trial}) | {r.side} | {r.killed} | {r.killed_step} "
            f"| {secs} | {world} | {resumed} | {r.verdict} | {ratio} |"
        )
    return "\n".join(rows)


def split_table(found: list[Restart]) -> str:
    """Kill -> first step, both sides, read from the step lines alike."""
    rows = [
        "| kill -> first step, from the step lines | side | " + " | ".join(SPLIT) + " | total |",
        "|---" * (len(SPLIT) + 3) + "|",
    ]
    key = {s: i for i, s in enumerate(SCENARIOS)}
    for r in sorted(found, key=lambda r: (key[r.scenario], r.trial, r.side != "torchrun")):
        if not r.split:
            continue
        cells = [f"{r.split[p]:.2f}" for p in SPLIT] + [f"{sum(r.split.values()):.2f}"]
        rows.append(
            f"| {LABEL[r.scenario]} (trial {r.trial}) | {r.side} | " + " | ".join(cells) + " |"
        )
    return "\n".join(rows)


def phase_table(found: list[Restart]) -> str:
    """Where hotspare's time goes, from the console's journal, each phase after the last."""
    rows = [
        "| hotspare | " + " | ".join(PHASES) + " | console's first_step | first step line |",
        "|---" * (len(PHASES) + 3) + "|",
    ]
    for r in (r for r in found if r.side == "hotspare"):
        cells = [f"{r.phases[p]:.2f}" if p in r.phases else "-" for p in PHASES]
        cells += [f"{r.console_s:.2f}" if r.console_s is not None else "-"]
        cells += [f"{r.seconds:.2f}" if r.seconds is not None else "-"]
        rows.append(f"| {LABEL[r.scenario]} (trial {r.trial}) | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def where_time_goes(found: list[Restart], lease_s: float) -> str:
    """hotspare's kill -> first step in words, from the medians of the journal's phases."""
    out = [
        "Where hotspare's time goes (journal phases, from the kill): detect = the console "
        "calls the host silent (missed heartbeats); decide = the rest of its lease waited out "
        "(a host that cannot be asked may still train under the lease it holds), so detect + "
        f"decide is the lease wait (at most lease_s {lease_s:g} s + clock skew after the last "
        "renewal); transfer = committed step chosen, the shard's replica promoted on the "
        "spare; start = executors up (survivors warm, the spare's started); load = rank 0's "
        "command started from the committed step; first step = torchrun's agent and worker "
        "start, import torch, join and load, one step (rank 0's Progress as the console saw "
        "it)."
    ]
    for scenario in SCENARIOS:
        hs = [r for r in found if r.side == "hotspare" and r.scenario == scenario and r.phases]
        if not hs:
            continue
        ph = {p: _median([r.phases.get(p, 0.0) for r in hs]) for p in PHASES}
        wait = ph["detect"] + ph["decide"]
        console = ph["transfer"] + ph["start"] + ph["load"]
        total = sum(ph.values())
        out.append(
            f"{LABEL[scenario]} (median of {len(hs)}): {total:.1f} s = lease wait {wait:.1f} s "
            f"({100 * wait / total:.0f} %) + the console's restart {console:.1f} s + torchrun "
            f"and the script starting again {ph['first step']:.1f} s "
            f"({100 * ph['first step'] / total:.0f} %)."
        )
    return "\n".join(out)


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan


def figures(found: list[Restart], lease_s: float) -> list[Figure]:
    out: list[Figure] = []
    bar = lease_s + GRACE_S
    for scenario in SCENARIOS:
        hs = [r for r in found if r.side == "hotspare" and r.scenario == scenario]
        tr = [r for r in found if r.side == "torchrun" and r.scenario == scenario]
        what = LABEL[scenario]
        if hs:
            med = _median([r.seconds for r in hs if r.seconds is not None])
            if len(hs) > sum(r.survived for r in hs):
                med = math.inf  # a trial that never came back is not left out of the median
            same = all(r.world_after == r.world_before for r in hs)
            worlds = [r.world_after for r in hs if r.world_after is not None]
            done = sum(r.survived and r.finished for r in hs)
            out += [
                Figure(f"hotspare, {what}: kill -> first step (median)", med, "s",
                       f"<= {bar:g} s (lease_s + {GRACE_S:g} s)", at_most(med, bar)),
                Figure(f"hotspare, {what}: world size after (min)", min(worlds, default=math.nan),
                       "ranks", f"= {hs[0].world_before} (as before the kill)", same),
                Figure(f"hotspare, {what}: trials that came back and finished", done,
                       f"of {len(hs)}", f"= {len(hs)}", done == len(hs)),
            ]  # fmt: skip
            if scenario == "member":
                x = TORCHRUN_DEFAULT_S / med if med > 0 else math.nan
                out.append(
                    Figure(f"hotspare, {what}: vs torchrun's {TORCHRUN_DEFAULT_S:g} s at its "
                           "default timeouts", x, "x faster", f">= {SPEEDUP:g}x",
                           at_least(x, SPEEDUP))
                )  # fmt: skip
            for p in PHASES:
                vals = [r.phases[p] for r in hs if p in r.phases]
                if vals:
                    out.append(Figure(f"hotspare, {what}: {p} (median)", _median(vals), "s"))
        if tr:
            med_t = _median([r.seconds for r in tr if r.seconds is not None])
            alive = sum(r.survived for r in tr)
            out.append(Figure(f"torchrun (this run), {what}: trials the job survived", alive,
                              f"of {len(tr)}"))  # fmt: skip
            if alive:
                out.append(
                    Figure(f"torchrun (this run), {what}: kill -> first step (median)", med_t, "s")
                )
            if hs and alive and all(r.survived for r in hs):
                ratio = med_t / _median([r.seconds for r in hs if r.seconds is not None])
                out.append(Figure(f"torchrun / hotspare (this run), {what}", ratio, "x"))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="1 trial")
    ap.add_argument("--only", default=",".join(SCENARIOS), help="of: " + ", ".join(SCENARIOS))
    ap.add_argument("--sides", default="torchrun,hotspare", help="of: torchrun, hotspare")
    ap.add_argument("--torchrun-defaults", action="store_true", help="torchrun's own timeouts")
    ap.add_argument("--keep", type=Path, help="work in this new folder and keep it (logs)")
    ap.add_argument("--json", action="store_true", help="also print one JSON line last")
    args = ap.parse_args()
    trials = 1 if args.quick else args.trials
    chosen = tuple(s.strip() for s in args.only.split(",") if s.strip())
    sides = {s.strip() for s in args.sides.split(",") if s.strip()}
    if not chosen or any(s not in SCENARIOS for s in chosen):
        ap.error(f"--only: pick from {', '.join(SCENARIOS)}")
    if not sides or not sides <= {"torchrun", "hotspare"} or trials < 1:
        ap.error("--sides: torchrun, hotspare or both; --trials >= 1")
    rdzv = dict(mht.RDZV_DEFAULTS if args.torchrun_defaults else mht.RDZV_SHORT)
    settings, hs = mht.Settings(rdzv=rdzv), Hotspare()
    if why := netbed.unavailable() or netbed.forward_blocked():
        print(f"multihost_restart: cannot make routed namespaces here: {why}", file=sys.stderr)
        sys.exit(1)
    found: list[Restart] = []
    try:
        with contextlib.ExitStack() as stack:
            if args.keep:
                args.keep.mkdir(parents=True)
                d = args.keep
            else:  # short: sshd's and the executors' unix socket paths live under it
                d = Path(
                    stack.enter_context(tempfile.TemporaryDirectory(prefix="mhr-", dir="/tmp"))
                )
            if "torchrun" in sides:
                scen = tuple(TORCHRUN_SCENARIO[s] for s in chosen)
                for r in range(trials):
                    outcomes = mht.measure(settings, 1, d / "torchrun" / str(r), scen)
                    found += [from_torchrun(o, r + 1, d / "torchrun" / str(r)) for o in outcomes]
            if "hotspare" in sides:
                found += measure_hotspare(settings, hs, trials, d / "hotspare", chosen)
    except (OSError, RuntimeError, TimeoutError, sshbed.SshdError) as e:
        print(f"multihost_restart: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)
    lease_s = ConsoleSettings().lease_s
    print(table(found))
    print()
    print(split_table(found))
    print()
    if any(r.side == "hotspare" for r in found):
        print(phase_table(found))
        print()
        print(where_time_goes(found, lease_s))
        print()
    notes = (
        f"{trials} trial(s); torchrun: {settings.describe()}; {hs.describe()}; "
        f"{os.cpu_count()} CPUs"
    )
    emit("multihost_restart", figures(found, lease_s), notes, args.json)


if __name__ == "__main__":
    main()
