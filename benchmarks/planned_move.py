"""A planned move (issue 28): an operator drains the job's host; how long is training down?

Two local hosts, ``a`` (the job's) and ``b`` (its spare), ``hotspare run`` at the shipped
defaults (each console setting fleetbed's FAST_CONSOLE shortens put back to its
``ConsoleSettings`` value) for two jobs:

- ``torch``: the torch kind and the shipped demo's job (``charlm``, the demo's config,
  a checkpoint every 50 steps); a drain checkpoints at the current step (no step lost);
- ``nanogpt``: the command kind and a nanoGPT-style script (tests/train_nanogpt_style.py,
  ``layout = "nanogpt"``, one ``ckpt.pt`` rewritten every 60 iterations, 0.05 s a step); a
  drain is a SIGTERM: the script cannot be told to checkpoint, so it loses the steps since its
  last ``ckpt.pt``.

each with the warm standby at its default (on for a job on one host: an idle executor on
``b``, readied for the job by ``Prepare``) and with ``warm_standby = false``. Once ``a`` has
trained to ``drain_at``, a checkpoint is on ``b`` and, with the standby, ``b``'s executor tree
has settled (its CPU time unchanged for 1 s: warm-up and imports done), ``b``'s memory is read
(PSS of the standby executor and its descendants, /proc/PID/smaps_rollup) and ``a`` is drained
through the controller's control socket, as a view's ``d`` does.

Read from outside the supervisor: the executors' ``events.jsonl`` on each host, tailed every
5 ms (lines stamped as they arrive). Down = ``b``'s first step - ``a``'s ``stopped`` event (its
run has ended); order -> first step = ``b``'s first step - the drain order. ``b``'s first step
is the torch kind's first ``progress`` event (forced at the first step after a start) or the
script's first progress line. Lost = ``a``'s last step - ``b``'s first step + 1.

Goal (issue 28): down at most 1 s at the defaults.

    python benchmarks/planned_move.py [--trials 3] [--quick] [--only torch,nanogpt] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from byo_script import (  # noqa: E402
    SHIPPED,
    SUBJECTS,
    Feed,
    Seen,
    _end,
    _env,
    _executors,
    wait_for,
)
from common import Figure, at_most, emit  # noqa: E402
from support.fleetbed import local_host, write_inventory  # noqa: E402

from console.reach.transport import local_host as host_procs  # noqa: E402
from console.service.client import Remote  # noqa: E402

GOAL_S = 1.0
PHASE_TIMEOUT_S = 300.0
MOVE_TIMEOUT_S = 120.0
SETTLED_S = 1.0
"""The standby's executor tree counts as ready once its CPU time is unchanged this long."""
KINDS = ("torch", "nanogpt")
NANO_STEP = re.compile(SUBJECTS["nanogpt"].progress)
DEMO_CONFIG = {"n_layer": 2, "n_embd": 64, "block_size": 64, "global_batch": 16, "lr": 3e-3}


@dataclass(frozen=True)
class Case:
    kind: str
    warm: bool
    """The warm standby at its default (on), or ``warm_standby = false``."""

    @property
    def label(self) -> str:
        return f"{self.kind}, {'warm standby (default)' if self.warm else 'warm_standby = false'}"


@dataclass
class Trial:
    case: Case
    order_t: float
    stopped_t: float
    first_t: float
    last_a: int
    first_b: int
    standby_mib: float | None

    @property
    def down(self) -> float:
        return self.first_t - self.stopped_t

    @property
    def order_to_step(self) -> float:
        return self.first_t - self.order_t

    @property
    def lost(self) -> int:
        return self.last_a - self.first_b + 1


def job_table(kind: str, warm: bool, steps: int) -> dict[str, Any]:
    job: dict[str, Any] = {"host": "a", "spares": ["b"], "steps": steps}
    if not warm:
        job["warm_standby"] = False
    if kind == "torch":
        return {
            **job,
            "executor": "torch",
            "workload": "charlm",
            "checkpoint_every_steps": 50,
            "config": DEMO_CONFIG,
        }
    return {**job, "executor": "command", "command": SUBJECTS["nanogpt"].command()}


def step_of(kind: str, s: Seen) -> int | None:
    """A training step in an executor's events: the torch kind's progress, a script's line."""
    if kind == "torch":
        if s.kind != "progress":
            return None
        m = re.search(r'"step":\s*(\d+)', s.text)
        return int(m[1]) if m else None
    m = NANO_STEP.match(s.text) if s.kind == "stdout" else None
    return int(m["step"]) if m else None


def tree(pid: int) -> list[int]:
    """``pid`` and its live descendants, from /proc."""
    parents: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                raw = Path(f"/proc/{name}/stat").read_bytes()
                ppid = int(raw[raw.rfind(b")") + 2 :].split()[1])
                parents.setdefault(ppid, []).append(int(name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += parents.get(p, [])
    return out


def cpu_ticks(pids: list[int]) -> int:
    total = 0
    for p in pids:
        with contextlib.suppress(OSError, IndexError, ValueError):
            raw = Path(f"/proc/{p}/stat").read_bytes()
            fields = raw[raw.rfind(b")") + 2 :].split()
            total += int(fields[11]) + int(fields[12])
    return total


def pss_mib(pids: list[int]) -> float:
    kib = 0
    for p in pids:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{p}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    kib += int(line.split()[1])
    return kib / 1024


def standby_pid(root: Path) -> int | None:
    try:
        return int((root / "jobs" / "j" / "executor.pid").read_text().strip())
    except (OSError, ValueError):
        return None


def settled(root: Path) -> int | None:
    """The standby executor's pid once its tree's CPU time stays unchanged ``SETTLED_S``."""
    pid = standby_pid(root)
    if pid is None:
        return None
    before = cpu_ticks(tree(pid))
    time.sleep(SETTLED_S)  # the measurement itself: CPU time over a second
    return pid if cpu_ticks(tree(pid)) == before else None


def run(folder: Path, case: Case, drain_at: int, steps: int) -> Trial:
    inv = write_inventory(
        folder / "inventory.toml",
        hosts={"a": local_host(folder / "a"), "b": local_host(folder / "b", role="spare")},
        jobs={"j": job_table(case.kind, case.warm, steps)},
        regions=("r1",),
        **SHIPPED,
    )
    feed_a = Feed.events(folder / "a" / "jobs" / "j" / "events.jsonl")
    feed_b = Feed.events(folder / "b" / "jobs" / "j" / "events.jsonl")
    argv = [sys.executable, "-m", "console.cli", "--inventory", str(inv), "run"]
    with open(folder / "hotspare.out", "wb") as out:
        proc = subprocess.Popen(
            [*argv, "--policy", "auto"], stdout=out, stderr=subprocess.STDOUT,
            env=_env(), cwd=ROOT, start_new_session=True,
        )  # fmt: skip
    alive = lambda: proc.poll() is None  # noqa: E731
    replicas = folder / "b" / "replicas" / "j"
    try:
        wait_for(
            lambda: (
                max((s for x in feed_a.seen() if (s := step_of(case.kind, x)) is not None),
                    default=-1) >= drain_at and any(replicas.glob("step-*.json"))
            ) or None,
            PHASE_TIMEOUT_S, alive, f"step {drain_at} and a replica on b",
        )  # fmt: skip
        standby_mib = None
        if case.warm:
            pid = wait_for(lambda: settled(folder / "b"), PHASE_TIMEOUT_S, alive, "b's standby")
            standby_mib = pss_mib(tree(pid))
        order_t = time.time()
        Remote(folder / "state").call("drain_host", "a")
        stopped = wait_for(
            lambda: next((x for x in feed_a.seen() if x.kind == "stopped"), None),
            MOVE_TIMEOUT_S, alive, "a's run stopped",
        )  # fmt: skip
        first = wait_for(
            lambda: next(
                (x for x in feed_b.seen() if x.t >= order_t and step_of(case.kind, x) is not None),
                None,
            ),
            MOVE_TIMEOUT_S, alive, "a step on b",
        )  # fmt: skip
        last_a = max(s for x in feed_a.seen() if (s := step_of(case.kind, x)) is not None)
        if case.kind == "torch":  # a's progress is sampled; its stop names the step it reached
            m = re.search(r'"step":\s*(\d+)', stopped.text)
            last_a = int(m[1]) if m else last_a
        first_b = step_of(case.kind, first)
        assert first_b is not None
    finally:
        _end(proc)
        feed_a.close()
        feed_b.close()
        for name in ("a", "b"):  # the executors outlive the console
            root = folder / name
            host_procs.kill(host_procs.host_cgroup(name, str(root)), _executors(root, folder))
    return Trial(case, order_t, stopped.t, first.t, last_a, first_b, standby_mib)


@dataclass
class Results:
    by: dict[Case, list[Trial]] = field(default_factory=dict)
    failed: dict[Case, str] = field(default_factory=dict)


def figures(res: Results) -> list[Figure]:
    out: list[Figure] = []
    for case, trials in res.by.items():
        if case in res.failed or not trials:
            out.append(Figure(f"{case.label}: down (median)", math.nan, "s", "", False))
            continue
        down = statistics.median(t.down for t in trials)
        goal = case.warm
        out.append(
            Figure(
                f"{case.label}: down, a's stop -> b's first step (median)",
                down,
                "s",
                f"<= {GOAL_S:g}" if goal else "",
                at_most(down, GOAL_S) if goal else None,
            )
        )
        out.append(
            Figure(
                f"{case.label}: drain order -> b's first step (median)",
                statistics.median(t.order_to_step for t in trials),
                "s",
            )
        )
        out.append(Figure(f"{case.label}: lost steps (max)", max(t.lost for t in trials), "steps"))
        mib = [t.standby_mib for t in trials if t.standby_mib is not None]
        if mib:
            out.append(Figure(f"{case.label}: standby memory on b (PSS)", max(mib), "MiB"))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--only", default=",".join(KINDS), help=f"of: {', '.join(KINDS)}")
    ap.add_argument("--quick", action="store_true", help="1 trial each")
    ap.add_argument("--json", action="store_true", help="also print one JSON line last")
    args = ap.parse_args()
    kinds = [k.strip() for k in args.only.split(",") if k.strip()]
    if not kinds or any(k not in KINDS for k in kinds):
        ap.error(f"--only: pick from {', '.join(KINDS)}")
    if args.quick:
        args.trials = 1
    if args.trials < 1:
        ap.error("--trials >= 1")
    cases = [Case(k, w) for k in kinds for w in (True, False)]
    res = Results(by={c: [] for c in cases})
    drain_at = {"torch": 120, "nanogpt": 100}
    steps = {"torch": 100_000, "nanogpt": 100_000}
    try:
        with tempfile.TemporaryDirectory(
            prefix="move-", dir=os.environ.get("HOTSPARE_BENCH_DIR")
        ) as d:
            for r in range(args.trials):
                for case in cases[r % len(cases) :] + cases[: r % len(cases)]:
                    if case in res.failed:
                        continue
                    folder = Path(d) / f"{case.kind}-{int(case.warm)}-{r}"
                    folder.mkdir()
                    try:
                        t = run(folder, case, drain_at[case.kind], steps[case.kind])
                    except (RuntimeError, TimeoutError) as e:
                        res.failed[case] = f"{type(e).__name__}: {e}"
                        print(f"round {r + 1}: {case.label}: {res.failed[case]}", file=sys.stderr)
                        continue
                    res.by[case].append(t)
                    print(
                        f"round {r + 1}: {case.label}: down {t.down:.2f} s, order -> step "
                        f"{t.order_to_step:.2f} s, lost {t.lost}",
                        file=sys.stderr,
                        flush=True,
                    )
    except OSError as e:
        print(f"planned_move: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)
    notes = (
        f"{args.trials} interleaved trials each; local hosts a -> b, hotspare run at the shipped "
        f"defaults (lease {SHIPPED['lease_s']:g} s); torch: charlm, the demo's config; nanogpt: "
        f"tests/train_nanogpt_style.py, ckpt.pt every 60 iterations, 0.05 s a step; "
        f"cpu, {os.cpu_count()} CPUs"
    )
    for case, why in res.failed.items():
        notes += f"; {case.label} FAILED ({why})"
    emit("planned_move", figures(res), notes, args.json)


if __name__ == "__main__":
    main()
