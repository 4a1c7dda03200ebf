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

A third row, ``torch-kind``: the same hosts, console and kills, the built-in torch kind
(tests/groupbed.py's three-rank charlm job), whose survivors restart in their warm executors;
it writes no step lines, so its figure is the console's (rank 0's first Progress).

Figure, read the same way on both sides: seconds from the kill (taken just before it) to the
first step line a process started after the kill wrote (the script's own ``time.time()``),
the world size on that line, and whether the job ran to its end. For hotspare the incident's
phases come from the console's journal (``console/records/incidents.py``), from the kill.

    python benchmarks/multihost_restart.py [--trials 3] [--quick] [--json] [--keep DIR]
        [--only member,rank0] [--sides torchrun,hotspare,torch-kind] [--torchrun-defaults]

Prints one table of both sides with the ratio, kill -> first step split from the step lines,
hotspare's incident phases from the journal and where its time goes, then the figures with
targets: back at the same world size within lease_s + 2 s, at least 5x faster than torchrun's
57.6 s at its default timeouts, and surviving the loss of rank 0's host.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "benchmarks")]

import multihost_hotspare as mhh  # noqa: E402
import multihost_torchrun as mht  # noqa: E402
from common import Figure, at_least, at_most, emit  # noqa: E402
from multihost_hotspare import LABEL, SCENARIOS, SPLIT, TORCH_KIND, Restart  # noqa: E402
from support import netbed, sshbed  # noqa: E402

from console.inventory import ConsoleSettings  # noqa: E402

TORCHRUN_SCENARIO = {"member": "worker", "rank0": "store"}
TORCHRUN_DEFAULT_S = 57.6
"""torchrun --nnodes 2:4 at its default rendezvous timeouts, a non-store node killed (issue 15)."""
SPEEDUP = 5.0
GRACE_S = 2.0
"""The goal: back at the same world size within lease_s + this."""
PHASES = ("detect", "decide", "transfer", "start", "load", "first step")
SIDES = ("torchrun", "hotspare", "torch-kind")


def from_torchrun(o: mht.Outcome, trial: int, folder: Path) -> Restart:
    """``folder``: where ``mht.measure`` ran this trial (its nodes' logs)."""
    rank = "" if o.killed_rank is None else f" (rank {o.killed_rank})"
    scenario = next(s for s, t in TORCHRUN_SCENARIO.items() if t == o.scenario)
    nodes = sorted((folder / f"{o.scenario}-0").glob("node*"))
    logs = [n / "steps.log" for n in nodes if n.name != f"node{o.killed_node}"]
    return Restart(
        "torchrun", scenario, trial, f"node {o.killed_node}{rank}", o.killed_step,
        o.world_before, o.seconds, o.world_after, o.resumed_step, o.finished, mht.verdict(o),
        split=mhh.split(logs, o.kill_t),
    )  # fmt: skip


# ------------------------------------------------------------------- output


def _ratio(torchrun: Restart | None, hotspare: Restart) -> str:
    if torchrun is None:
        return ""
    if torchrun.seconds is not None and hotspare.seconds:
        return f"{torchrun.seconds / hotspare.seconds:.1f}x"
    if torchrun.seconds is None and hotspare.seconds is not None:
        return "torchrun's job died"
    return "-"


def _order(r: Restart) -> tuple[int, int, int]:
    sides = ("torchrun", "hotspare", TORCH_KIND)
    return SCENARIOS.index(r.scenario), r.trial, sides.index(r.side)


def table(found: list[Restart]) -> str:
    rows = [
        "| scenario | side | killed | at step | kill -> first step | world | resumed from "
        "| outcome | torchrun / hotspare |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(found, key=_order):
        same = [t for t in found if (t.scenario, t.trial) == (r.scenario, r.trial)]
        pair = next((t for t in same if t.side == "torchrun"), None)
        secs = "" if r.seconds is None else f"{r.seconds:.2f} s"
        world = f"{r.world_before} -> {r.world_after or '-'}"
        resumed = "" if r.resumed_step is None else str(r.resumed_step)
        ratio = _ratio(pair, r) if r.side != "torchrun" else ""
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
    for r in sorted(found, key=_order):
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
        "| hotspare, journal phases | " + " | ".join(PHASES) + " | console's first_step "
        "| first step line |",
        "|---" * (len(PHASES) + 3) + "|",
    ]
    for r in sorted((r for r in found if r.side != "torchrun"), key=_order):
        cells = [f"{r.phases[p]:.2f}" if p in r.phases else "-" for p in PHASES]
        cells += [f"{r.console_s:.2f}" if r.console_s is not None else "-"]
        cells += [f"{r.seconds:.2f}" if r.seconds is not None and r.side == "hotspare" else "-"]
        what = f"{LABEL[r.scenario]} (trial {r.trial})"
        rows.append(f"| {r.side}: {what} | " + " | ".join(cells) + " |")
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
        "Resumed (the command kind: as soon as the command is started; the torch kind: once "
        "the group joined, which waits for the spare's cold executor to import torch); first "
        "step = to rank 0's first step as the console saw it (the command kind: torchrun's "
        "agent and worker start on every member, import torch, join and load)."
    ]
    for side, again in (
        ("hotspare", "torchrun and the script"),
        (TORCH_KIND, "training (the spare's cold executor joining)"),
    ):
        for scenario in SCENARIOS:
            rs = [r for r in found if (r.side, r.scenario) == (side, scenario) and r.phases]
            if not rs:
                continue
            ph = {p: _median([r.phases.get(p, 0.0) for r in rs]) for p in PHASES}
            wait = ph["detect"] + ph["decide"]
            console = ph["transfer"] + ph["start"]
            again_s = ph["load"] + ph["first step"]
            total = sum(ph.values())
            out.append(
                f"{side}, {LABEL[scenario]} (median of {len(rs)}): {total:.1f} s = lease wait "
                f"{wait:.1f} s ({100 * wait / total:.0f} %) + the console's restart "
                f"{console:.1f} s (transfer, start) + {again} starting again {again_s:.1f} s "
                f"(load, first step: {100 * again_s / total:.0f} %)."
            )
    return "\n".join(out)


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan


def _hotspare_figures(side: str, rs: list[Restart], what: str, lease_s: float) -> list[Figure]:
    bar = lease_s + GRACE_S
    med = _median([r.seconds for r in rs if r.seconds is not None])
    if len(rs) > sum(r.survived for r in rs):
        med = math.inf  # a trial that never came back is not left out of the median
    same = all(r.world_after == r.world_before for r in rs)
    worlds = [r.world_after for r in rs if r.world_after is not None]
    done = sum(r.survived and r.finished for r in rs)
    how = "" if side == "hotspare" else " (console's view)"
    out = [
        Figure(f"{side}, {what}: kill -> first step{how} (median)", med, "s",
               f"<= {bar:g} s (lease_s + {GRACE_S:g} s)", at_most(med, bar)),
        Figure(f"{side}, {what}: world size after (min)", min(worlds, default=math.nan),
               "ranks", f"= {rs[0].world_before} (as before the kill)", same),
        Figure(f"{side}, {what}: trials that came back and finished", done,
               f"of {len(rs)}", f"= {len(rs)}", done == len(rs)),
    ]  # fmt: skip
    if rs[0].scenario == "member":
        x = TORCHRUN_DEFAULT_S / med if med > 0 else math.nan
        out.append(
            Figure(f"{side}, {what}: vs torchrun's {TORCHRUN_DEFAULT_S:g} s at its default "
                   "timeouts", x, "x faster", f">= {SPEEDUP:g}x", at_least(x, SPEEDUP))
        )  # fmt: skip
    for p in PHASES:
        vals = [r.phases[p] for r in rs if p in r.phases]
        if vals:
            out.append(Figure(f"{side}, {what}: {p} (median)", _median(vals), "s"))
    return out


def figures(found: list[Restart], lease_s: float) -> list[Figure]:
    out: list[Figure] = []
    for scenario in SCENARIOS:
        what = LABEL[scenario]
        hs = [r for r in found if r.side == "hotspare" and r.scenario == scenario]
        tk = [r for r in found if r.side == TORCH_KIND and r.scenario == scenario]
        tr = [r for r in found if r.side == "torchrun" and r.scenario == scenario]
        for side, rs in (("hotspare", hs), (TORCH_KIND, tk)):
            if rs:
                out += _hotspare_figures(side, rs, what, lease_s)
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
    ap.add_argument("--sides", default=",".join(SIDES), help="of: " + ", ".join(SIDES))
    ap.add_argument("--torchrun-defaults", action="store_true", help="torchrun's own timeouts")
    ap.add_argument("--keep", type=Path, help="work in this new folder and keep it (logs)")
    ap.add_argument("--json", action="store_true", help="also print one JSON line last")
    args = ap.parse_args()
    trials = 1 if args.quick else args.trials
    chosen = tuple(s.strip() for s in args.only.split(",") if s.strip())
    sides = {s.strip() for s in args.sides.split(",") if s.strip()}
    if not chosen or any(s not in SCENARIOS for s in chosen):
        ap.error(f"--only: pick from {', '.join(SCENARIOS)}")
    if not sides or not sides <= set(SIDES) or trials < 1:
        ap.error(f"--sides: of {', '.join(SIDES)}; --trials >= 1")
    rdzv = dict(mht.RDZV_DEFAULTS if args.torchrun_defaults else mht.RDZV_SHORT)
    settings, hs = mht.Settings(rdzv=rdzv), mhh.Hotspare()
    if why := netbed.unavailable() or netbed.forward_blocked():
        print(f"multihost_restart: cannot make routed namespaces here: {why}", file=sys.stderr)
        sys.exit(1)
    found: list[Restart] = []
    load_before = os.getloadavg()[0]
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
                found += mhh.measure("hotspare", settings, hs, trials, d / "hotspare", chosen)
            if "torch-kind" in sides:
                where = d / "torch-kind"
                found += mhh.measure("hotspare-torch", settings, hs, trials, where, chosen)
    except (OSError, RuntimeError, TimeoutError, sshbed.SshdError) as e:
        print(f"multihost_restart: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)
    lease_s = ConsoleSettings().lease_s
    print(table(found))
    print()
    print(split_table(found))
    print()
    if any(r.side != "torchrun" for r in found):
        print(phase_table(found))
        print()
        print(where_time_goes(found, lease_s))
        print()
    notes = (
        f"{trials} trial(s); torchrun: {settings.describe()}; {hs.describe()}; "
        f"{os.cpu_count()} CPUs, load average (1 min) {load_before:.1f} at the start and "
        f"{os.getloadavg()[0]:.1f} at the end (whatever else ran here shared them)"
    )
    emit("multihost_restart", figures(found, lease_s), notes, args.json)


if __name__ == "__main__":
    main()
