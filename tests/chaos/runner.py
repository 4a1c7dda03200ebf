"""The long chaos run: seeded episodes until N faults have been injected, then a summary table
(faults by kind, survived, MTTR p50/p95, lost steps, false failovers). ``scripts/chaos``.

    scripts/chaos --faults 200 --seed 7
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Sequence

from chaos.episode import Config, Episode, Result
from chaos.faults import ARMED, INJECTORS

PER_EPISODE = 8
ONCE_PER_EPISODE = {"gpu_fail", *ARMED}
"""A GPU FAIL drains its host for good; NaN and OOM are armed once per host environment."""


def draw(rng: random.Random, n: int) -> list[str]:
    """``n`` fault kinds for one episode, each kind at most once where it must be."""
    pool = list(INJECTORS) + list(ARMED)
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


def summary(results: list[Result], wall_s: float) -> str:
    rows: dict[str, dict[str, list[float] | int]] = defaultdict(
        lambda: {"n": 0, "ok": 0, "mttr": [], "lost": []}
    )
    for r in results:
        clean = not [v for v in r.violations if ":" not in v or "incident" not in v]
        for m in r.matches:
            row = rows[m.fault.kind]
            row["n"] += 1  # type: ignore[operator]
            row["ok"] += int(m.ok and clean)  # type: ignore[operator]
            if m.incident is not None and m.incident.mttr_s is not None:
                row["mttr"].append(m.incident.mttr_s)  # type: ignore[union-attr]
            if m.incident is not None and m.incident.lost_steps is not None:
                row["lost"].append(m.incident.lost_steps)  # type: ignore[union-attr]
    out = ["| fault | injected | survived | MTTR p50 | MTTR p95 | lost steps (sum / max) |"]
    out.append("|---|---|---|---|---|---|")

    def fmt(x: float | None) -> str:
        return "-" if x is None else f"{x:.2f} s"

    total = {"n": 0, "ok": 0, "mttr": [], "lost": []}
    for kind in sorted(rows):
        row = rows[kind]
        mttr, lost = list(row["mttr"]), list(row["lost"])  # type: ignore[call-overload]
        out.append(
            f"| {kind} | {row['n']} | {row['ok']} | {fmt(_pct(mttr, 50))} | {fmt(_pct(mttr, 95))} "
            f"| {int(sum(lost)) if lost else '-'} / {int(max(lost)) if lost else '-'} |"
        )
        total["n"] += row["n"]  # type: ignore[operator]
        total["ok"] += row["ok"]  # type: ignore[operator]
        total["mttr"] += mttr  # type: ignore[operator]
        total["lost"] += lost  # type: ignore[operator]
    m, lost = total["mttr"], total["lost"]
    out.append(
        f"| **all** | {total['n']} | {total['ok']} | {fmt(_pct(m, 50))} | {fmt(_pct(m, 95))} "  # type: ignore[arg-type]
        f"| {int(sum(lost)) if lost else '-'} / {int(max(lost)) if lost else '-'} |"  # type: ignore[arg-type]
    )
    leftover = sum(len(r.leftover) for r in results)
    out.append("")
    out.append(
        f"episodes {len(results)}, false failovers {sum(r.false_failovers for r in results)}, "
        f"incidents no fault explains {leftover}, damaged checkpoints met and skipped "
        f"{sum(r.corrupt_skips for r in results)}, checkpoint loads checked "
        f"{sum(r.loads for r in results)}, "
        f"violations {sum(len(r.violations) for r in results)}, wall {wall_s / 60:.1f} min"
    )
    for r in results:
        for v in r.violations:
            out.append(f"- seed {r.seed}: {v}")
        for s in r.skipped:
            out.append(f"- seed {r.seed}: not injected: {s}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="scripts/chaos", description=__doc__.split("\n")[0])
    p.add_argument("--faults", type=int, default=200, help="faults to inject in all (default 200)")
    p.add_argument("--seed", type=int, default=7, help="seed of the first episode (default 7)")
    p.add_argument("--per-episode", type=int, default=PER_EPISODE, help="faults per fleet")
    p.add_argument("--jobs", type=int, choices=(1, 2), default=1, help="jobs per fleet")
    p.add_argument("--keep", action="store_true", help="keep every episode's folder")
    args = p.parse_args(argv)
    if args.faults < 1 or args.per_episode < 1:
        print("scripts/chaos: --faults and --per-episode must be at least 1", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    results: list[Result] = []
    injected, seed = 0, args.seed
    while injected < args.faults:
        rng = random.Random(seed)
        kinds = draw(rng, min(args.per_episode, args.faults - injected))
        cfg = Config(
            seed=seed,
            kinds=kinds,
            steps=steps_for(kinds),
            jobs=args.jobs,
            keep=args.keep,
            log=lambda m: print(m, flush=True),
        )
        print(f"episode seed {seed}: {', '.join(kinds)}", flush=True)
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
    return 0 if not any(r.violations for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
