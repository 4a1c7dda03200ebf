"""The long chaos run: seeded episodes until N faults have been injected, then a summary (faults
by kind, survived, inconclusive, MTTR targets missed, MTTR p50/p95, lost steps, false
failovers, two-trainer intervals, stale-epoch files, a restarted console's wait for a lease it
cannot see). ``scripts/chaos``.

The exit status is 1 when any episode has a violation, an inconclusive check among them (every
inconclusive but an overlapped fault's own: chaos.invariants), and 0 otherwise: an
inconclusive is never a pass. MTTR targets missed are counted and listed, and fail nothing
(performance, not safety).

    scripts/chaos --faults 200 --seed 7
    scripts/chaos --faults 12 --seed 5 --overlap 0.5 --jobs 2
    scripts/chaos --faults 12 --seed 5 --torchrun 1            (j a torchrun job: chaos.torchrun)
    scripts/chaos --faults 60 --seed 5 --jobs 2 --torchrun 1   (j torchrun beside k torch)
    scripts/chaos --group --faults 20 --seed 1     (a three-member job: chaos.group)
    scripts/chaos --group --elastic --faults 12 --seed 1   (min_hosts 2, no spare: shrink, grow)
    scripts/chaos --standby --faults 12 --seed 1   (two controllers on etcd: chaos.faults_standby)
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from chaos import ending, group
from chaos import invariants as inv
from chaos.episode import Config, Episode, Result
from chaos.faults import ARMED
from chaos.faults_fencing import LEASE_S, SKEW_S
from chaos.schedule import CONSOLE_KINDS, INJECTORS, STANDBY_KINDS
from chaos.torchrun import KIND as TORCHRUN
from chaos.torchrun import WORKERS

PER_EPISODE = 8
ONCE_PER_EPISODE = {"gpu_fail", *ARMED}
"""A GPU FAIL drains its host for good; NaN and OOM are armed once per host environment."""


def draw(rng: random.Random, n: int, armed: bool = True, standby: bool = False) -> list[str]:
    """``n`` fault kinds for one episode, each kind at most once where it must be; ``armed``:
    NaN and OOM among them (only a torch-kind job can be armed). ``standby``: the faults of
    standby controllers and etcd (twice as likely as each other kind) instead of those of one
    controller and its clock."""
    single = [k for k in INJECTORS if k not in STANDBY_KINDS]
    if standby:
        single = [k for k in single if k not in CONSOLE_KINDS and k != "wall_clock_step"]
    pool = single + (sorted(STANDBY_KINDS) * 2 if standby else [])
    pool += list(ARMED) if armed else []
    kinds: list[str] = []
    while len(kinds) < n:
        k = rng.choice(pool)
        if k in ONCE_PER_EPISODE and k in kinds:
            continue
        kinds.append(k)
    return kinds


def steps_for(kinds: Sequence[str]) -> int:
    """Long enough for every fault (a gap, a checkpoint, the steps lost) and each armed fault's
    quiet stretch, with room before the end."""
    armed = len([k for k in kinds if k in ARMED])
    return 3000 + 800 * (len(kinds) - armed) + 1500 * armed


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f} s"


@dataclass
class Row:
    n: int = 0
    overlapped: int = 0
    ok: int = 0
    """Survived: matched or absorbed, every check of the fault made, no violation."""
    inconclusive: int = 0
    """Faults with a check that could not be made (Injected.inconclusive)."""
    missed: int = 0
    """Faults that missed an MTTR target they measured (Injected.missed): not safety."""
    mttr: list[float] = field(default_factory=list)
    """Of faults alone only: an overlapped fault's incident times two faults."""
    lost: list[int] = field(default_factory=list)

    def add(self, other: Row) -> None:
        self.n += other.n
        self.overlapped += other.overlapped
        self.ok += other.ok
        self.inconclusive += other.inconclusive
        self.missed += other.missed
        self.mttr += other.mttr
        self.lost += other.lost

    def line(self, kind: str) -> str:
        lost = f"{sum(self.lost)} / {max(self.lost)}" if self.lost else "- / -"
        return (
            f"| {kind} | {self.n} | {self.overlapped} | {self.ok} | {self.inconclusive} "
            f"| {self.missed} | {_s(_pct(self.mttr, 50))} "
            f"| {_s(_pct(self.mttr, 95))} | {lost} |"
        )


def _rows(results: list[Result]) -> dict[str, Row]:
    rows: dict[str, Row] = defaultdict(Row)
    for r in results:
        clean = not [v for v in r.violations if ":" not in v or "incident" not in v]
        for m in r.matches:
            on = r.job_kinds.get(m.fault.job, "torch")
            row = rows[m.fault.kind + (f" ({on})" if on == TORCHRUN else "")]
            row.n += 1
            row.overlapped += int(m.fault.overlapped)
            row.ok += int(m.ok and clean and not m.fault.inconclusive)
            row.inconclusive += int(bool(m.fault.inconclusive))
            row.missed += int(bool(m.fault.missed))
            inc = m.incident
            if inc is not None and inc.mttr_s is not None and not m.fault.overlapped:
                row.mttr.append(inc.mttr_s)
            if inc is not None and inc.lost_steps is not None:
                row.lost.append(inc.lost_steps)
    return rows


def summary(results: list[Result], wall_s: float) -> str:
    rows = _rows(results)
    out = [
        "| fault | injected | overlapped | survived | inconclusive | MTTR missed | MTTR p50 "
        "| MTTR p95 | lost steps (sum / max) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    total = Row()
    for kind in sorted(rows):
        out.append(rows[kind].line(kind))
        total.add(rows[kind])
    out.append(total.line("**all**"))
    out.append("")
    out.append(
        "MTTR is of faults alone (an overlapped fault's incident also times the other fault); "
        "survived: matched or absorbed, every check of its own made, in an episode with no "
        "violation but incident ones; inconclusive: a check of its own could not be made "
        "(a failure unless the fault was overlapped); MTTR missed: a target it measured, "
        "missed (performance, not safety: fails nothing)"
    )
    restarts = [
        f.figures
        for r in results
        for f in r.faults
        if f.kind == "console_restart_partitioned" and "extra_s" in f.figures
    ]
    if restarts:
        extra = [x["extra_s"] for x in restarts]
        waited = [x["wait_end_s"] for x in restarts if "wait_end_s" in x]
        out.append(
            f"console_restart_partitioned ({len(extra)}): the restarted console's extra MTTR "
            f"(new epoch started after the persisted lease bound + skew) p50 "
            f"{_s(_pct(extra, 50))}, max {_s(max(extra))}; bound lease_s + clock_skew_s = "
            f"{LEASE_S + SKEW_S:.2f} s, over it {sum(x > LEASE_S + SKEW_S for x in extra)}; "
            f"its lease wait ended p50 {_s(_pct(waited, 50))} after the bound"
        )
    leftover = sum(len(r.leftover) for r in results)
    if any(TORCHRUN in r.job_kinds.values() for r in results):
        out.append(
            f"({TORCHRUN}): a torchrun job's fault (command kind, {WORKERS} workers); its lost "
            "steps are the console's count from the script's metrics file and checkpoints, as "
            "a torch job's from its progress; two-trainer intervals count torch-kind executors "
            "only (a training thread's CPU): a torchrun job's processes are checked by epoch "
            "instead (stale-epoch samples); nan/oom are armed in torch jobs only"
        )
    out.append("")
    out.append(
        f"episodes {len(results)}, false failovers {sum(r.false_failovers for r in results)}, "
        f"two-trainer intervals {sum(r.two_trainers for r in results)}, "
        f"stale-epoch files {sum(r.stale_files for r in results)}, "
        f"stale-epoch samples {_stale(results)}, "
        f"incidents no fault explains {leftover}, put down to overlaps "
        f"{sum(r.by_overlap for r in results)}, damaged checkpoints met and skipped "
        f"{sum(r.corrupt_skips for r in results)}, checkpoint loads checked "
        f"{sum(r.loads for r in results)}, "
        f"inconclusive {_inconclusive(results)}, MTTR targets missed "
        f"{sum(len(f.missed) for r in results for f in r.faults)}, "
        f"violations {sum(len(r.violations) for r in results)}, wall {wall_s / 60:.1f} min"
    )
    for r in results:
        for v in r.violations:
            out.append(f"- seed {r.seed}: {v}")
        for f in r.faults:
            for i in f.inconclusive if f.overlapped else ():  # the others are violations
                out.append(f"- seed {r.seed}: inconclusive (overlapped: counted only): {i}")
            for m in f.missed:
                out.append(f"- seed {r.seed}: target missed (not safety): {m}")
        for s in r.skipped:
            out.append(f"- seed {r.seed}: not injected: {s}")
        for i in r.leftover:
            out.append(
                f"- seed {r.seed}: no fault explains incident {i.id} ({i.fault_class}, {i.job} "
                f"on {i.host}, detected {i.times.get('detected', 0):.3f}, "
                f"{i.data.get('decided', {}).get('action', 'no action')})"
            )
    return "\n".join(out)


def _stale(results: list[Result]) -> str:
    """The /proc stale-epoch samples of torchrun jobs, of how many, and the inconclusive."""
    taken = sum(r.epoch_samples for r in results)
    if not any(TORCHRUN in r.job_kinds.values() for r in results):
        return "- (no torchrun job)"
    stale = sum(r.stale_samples for r in results)
    unseen = sum(r.epochs_unseen for r in results)
    return f"{stale} of {taken} (/proc; inconclusive {unseen})"


def _inconclusive(results: list[Result]) -> str:
    """How many checks could not be made: the faults' own, the episodes'; and how many of
    them were an overlapped fault's (counted, failing nothing)."""
    faults = [(f.overlapped, i) for r in results for f in r.faults for i in f.inconclusive]
    episode = sum(len(r.inconclusive) for r in results)
    overlapped = sum(o for o, _ in faults)
    return (
        f"{len(faults) + episode} (faults' {len(faults)}, of overlapped faults {overlapped}; "
        f"the episodes' {episode})"
    )


def failed(results: list[Result]) -> bool:
    """A violation anywhere, or an inconclusive but an overlapped fault's own (an episode makes
    each of those a violation too: chaos.invariants)."""
    return any(r.violations or r.inconclusive or inv.inconclusive(r.faults) for r in results)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="scripts/chaos", description=__doc__.split("\n")[0])
    p.add_argument("--faults", type=int, default=200, help="faults to inject in all (default 200)")
    p.add_argument("--seed", type=int, default=7, help="seed of the first episode (default 7)")
    p.add_argument(
        "--per-episode",
        type=int,
        help=f"faults per fleet (default {PER_EPISODE}; with --group {group.PER_EPISODE})",
    )
    p.add_argument("--jobs", type=int, choices=(1, 2), default=1, help="jobs per fleet")
    p.add_argument(
        "--torchrun",
        type=int,
        choices=(0, 1, 2),
        default=0,
        help="how many of the jobs (the first ones: j, then k) are torchrun jobs (command kind, "
        f"torchrun --standalone --nproc-per-node {WORKERS}) instead of torch-kind (default 0)",
    )
    p.add_argument(
        "--overlap",
        type=float,
        help="chance that a fault comes before the last one's recovery (default 0.3; with "
        "--group 0: one at a time)",
    )
    p.add_argument(
        "--group",
        action="store_true",
        help="a three-member job and two spares on five hosts instead (one job, its own faults)",
    )
    p.add_argument(
        "--elastic",
        action="store_true",
        help="with --group: min_hosts 2, deterministic_reduce, no spare and no other host (a "
        "lost member shrinks the group, healed it grows back)",
    )
    p.add_argument(
        "--standby",
        action="store_true",
        help="two controllers on a 3-member etcd cluster; the leader SIGKILLed and etcd members "
        "SIGKILLed among the faults (chaos.faults_standby)",
    )
    p.add_argument("--keep", action="store_true", help="keep every episode's folder")
    args = p.parse_args(argv)
    if args.per_episode is None:
        args.per_episode = group.PER_EPISODE if args.group else PER_EPISODE
    if args.overlap is None:
        args.overlap = 0.0 if args.group else 0.3
    if args.torchrun > args.jobs or (args.torchrun and args.group):
        print("scripts/chaos: --torchrun N takes N of the --jobs, not --group", file=sys.stderr)
        return 2
    if args.standby and args.group:
        print("scripts/chaos: --standby is for the single-host jobs, not --group", file=sys.stderr)
        return 2
    if args.elastic and not args.group:
        print("scripts/chaos: --elastic goes with --group", file=sys.stderr)
        return 2
    if args.faults < 1 or args.per_episode < 1 or not 0 <= args.overlap <= 1:
        print(
            "scripts/chaos: --faults and --per-episode must be at least 1, --overlap in [0, 1]",
            file=sys.stderr,
        )
        return 2
    ending.install()
    t0 = time.monotonic()
    results: list[Result] = []
    injected, seed = 0, args.seed
    while injected < args.faults:
        rng = random.Random(seed)
        n = min(args.per_episode, args.faults - injected)
        armed = args.torchrun < args.jobs
        kinds = group.draw(rng, n) if args.group else draw(rng, n, armed, args.standby)
        cfg = Config(
            seed=seed,
            kinds=kinds,
            steps=steps_for(kinds),
            jobs=args.jobs,
            torchrun=args.torchrun,
            overlap=args.overlap,
            standby=args.standby,
            keep=args.keep,
            log=lambda m: print(m, flush=True),
        )
        print(f"episode seed {seed}: {', '.join(kinds)}", flush=True)
        if args.group:
            cfg.gap_steps = group.GAP_STEPS
            r = group.GroupEpisode(cfg, elastic=args.elastic).run()
        else:
            r = Episode(cfg).run()
        results.append(r)
        injected += max(1, len(r.faults))
        print(
            f"episode seed {seed}: {len(r.faults)} faults, {len(r.violations)} violations, "
            f"{r.wall_s:.0f} s",
            flush=True,
        )
        seed += 1
    print()
    print(summary(results, time.monotonic() - t0))
    if args.group:
        print(group.victims(results))
    return 1 if failed(results) else 0


if __name__ == "__main__":
    sys.exit(main())
