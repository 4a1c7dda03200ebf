"""More than one rank per host: a rank's process SIGKILLed mid-run, hotspare against torchrun.

A two-host job of two ranks per host on this machine (hosts on loopback: local demo hosts for
hotspare, two torchrun agents for torchrun), the same fault for each side: one training
process of the second host (global rank 3) SIGKILLed once step ``--kill-at`` is done. Each
trial starts fresh; sides interleave. Figures per side: seconds from the start to the first
step, seconds from the kill to the first step after it, and steps lost (the last step before
the kill minus the step resumed from).

- ``torchrun``: ``torchrun --nnodes 2 --nproc-per-node 2 --rdzv-backend c10d --max-restarts 3``
  per host, benchmarks/ddp_plain.py (gloo, CPU, steps paced to ``--step-time``, a checkpoint
  every ``--save-every`` per host): the killed worker's agent restarts its workers, the other
  agent follows through the rendezvous, and all four resume from the newest checkpoint. Read
  from the script's own timestamped lines.
- ``hotspare``: the torch kind with ``procs_per_host = 2`` under the console (the shipped
  console settings, ``Policy.AUTO``): the killed process is local rank 1 of the second host, a
  follower; its member's run fails, and the console restarts the group in place (executors
  stay, followers are started again). The built-in charlm (tests' tiny config), steps paced to
  the same time (``slow_step``), a checkpoint every ``--save-every`` steps. Read from the
  console's journal (the incident's ``first_step``) and the executors' own events.
- ``hotspare_1``: the same job with one rank per host, the killed process being the second
  host's executor (its only rank): what a rank's loss costs without followers.

The scripts differ (an MLP under torchrun, charlm under the torch kind); both are tiny, so the
figures are the supervisors' (detection, process starts, ``import torch``, rendezvous, load).

    python benchmarks/local_ranks.py [--trials 3] [--quick] [--json]
        [--only torchrun,hotspare,hotspare_1] [--kill-at 70] [--steps 400] [--step-time 0.05]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import tomli_w

ROOT = Path(__file__).resolve().parent.parent
HERE = ROOT / "benchmarks"
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(HERE)]

from chaos.observe import executor_events  # noqa: E402
from chaos.procs import followers_in  # noqa: E402
from common import Figure, emit  # noqa: E402
from multihost_torchrun import Line, process_tree, read_log, step_of, steps  # noqa: E402
from support.distbed import free_port  # noqa: E402
from support.helpers import TINY_CONFIG  # noqa: E402

from console.controller import Controller  # noqa: E402
from console.inventory import load  # noqa: E402
from console.records.journal import Kind, read  # noqa: E402
from console.supervise.policy import Policy  # noqa: E402

SIDES = ("torchrun", "hotspare", "hotspare_1")
POLL_S = 0.01
SCRIPT = HERE / "ddp_plain.py"


@dataclass(frozen=True)
class Settings:
    steps: int = 400
    kill_at: int = 70
    save_every: int = 20
    step_time: float = 0.05
    timeout_s: float = 180.0


@dataclass
class Trial:
    side: str
    start_s: float
    recovered_s: float | None
    lost: int | None


def _until(cond: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout:.0f} s")
        time.sleep(POLL_S)


# ------------------------------------------------------------------ torchrun


def torchrun_trial(folder: Path, s: Settings) -> Trial:
    port = free_port()
    agents: list[subprocess.Popen[bytes]] = []
    logs = [folder / f"node{i}" / "steps.log" for i in range(2)]
    t0 = time.time()
    try:
        for i, log in enumerate(logs):
            log.parent.mkdir(parents=True)
            argv = [
                sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
                "--nproc-per-node", "2", "--rdzv-backend", "c10d",
                "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "bench",
                "--rdzv-conf", f"join_timeout=60,last_call_timeout=2,is_host={int(i == 0)}",
                "--local-addr", "127.0.0.1", "--max-restarts", "3", str(SCRIPT),
                "--checkpoint-dir", str(log.parent / "ckpt"), "--step-log", str(log),
                "--steps", str(s.steps), "--save-every", str(s.save_every),
                "--step-time", str(s.step_time),
            ]  # fmt: skip
            env = {
                **os.environ,
                "OMP_NUM_THREADS": "1",
                "PYTHONUNBUFFERED": "1",
                "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",  # see multihost_torchrun.py
            }
            with open(log.parent / "agent.out", "wb") as out:
                agents.append(
                    subprocess.Popen(
                        argv,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        env=env,
                        cwd=log.parent,
                        start_new_session=True,
                    )
                )

        def lines() -> list[Line]:
            return [ln for log in logs for ln in read_log(log)]

        _until(lambda: steps(lines()), s.timeout_s, "torchrun's first step")
        start_s = min(ln.t for ln in steps(lines())) - t0
        _until(
            lambda: any(step_of(ln) >= s.kill_at for ln in steps(lines())), s.timeout_s, "kill_at"
        )
        victim = next(ln.pid for ln in steps(read_log(logs[1])) if ln.field("rank") == 3)
        before = {ln.pid for ln in lines()}
        last = max(step_of(ln) for ln in steps(lines()))
        kill_t = time.time()
        os.kill(victim, signal.SIGKILL)

        def fresh() -> list[Line]:
            return [ln for ln in steps(lines()) if ln.t > kill_t and ln.pid not in before]

        _until(fresh, s.timeout_s, "a step of a restarted worker")
        first = min(fresh(), key=lambda ln: ln.t)
        loaded = [ln for ln in lines() if ln.pid == first.pid and ln.text.startswith("loaded ")]
        resumed = loaded[-1].field("step") if loaded else None
        return Trial(
            "torchrun", start_s, first.t - kill_t, None if resumed is None else last - resumed
        )
    finally:
        for a in agents:
            _kill_tree(a.pid)


def _kill_tree(pid: int) -> None:
    tree = process_tree(pid)
    for p in tree:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    psutil.wait_procs(tree, timeout=30)


# ------------------------------------------------------------------ hotspare


def inventory(folder: Path, procs: int, s: Settings) -> Path:
    hosts = {h: {"region": "r1", "transport": "local", "root": str(folder / h)} for h in ("a", "b")}
    job = {
        "hosts": ["a", "b"],
        "procs_per_host": procs,
        "steps": s.steps,
        "seed": 11,
        "checkpoint_every_steps": s.save_every,
        "keep_checkpoints": 3,
        "config": {**TINY_CONFIG, "global_batch": 8},
    }
    data = {
        "console": {"state_dir": str(folder / "state")},
        "regions": {"r1": {"priority": 1}},
        "hosts": hosts,
        "jobs": {"j": job},
    }
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "inventory.toml"
    path.write_text(tomli_w.dumps(data))
    return path


def _victim(folder: Path, procs: int) -> int:
    """The second host's rank 3: its follower (two per host), else its executor."""
    work = folder / "b" / "jobs" / "j"
    if procs == 1:
        return int((work / "executor.pid").read_text())
    (pid,) = followers_in(work)
    return pid


async def hotspare_trial(folder: Path, procs: int, s: Settings) -> Trial:
    inv = inventory(folder, procs, s)
    pace = {"HOTSPARE_INJECT": f"slow_step@{s.step_time}", "HOTSPARE_PROGRESS_S": "0"}
    ctl = Controller(load(inv), Policy.AUTO, executor_env={h: dict(pace) for h in "ab"})
    sup = ctl.jobs["j"]
    journal = folder / "state" / "journal.jsonl"
    t0 = time.time()
    task = asyncio.create_task(ctl.run())

    async def until(cond: object, what: str) -> None:
        deadline = time.monotonic() + s.timeout_s
        while not cond():  # type: ignore[operator]
            if task.done() or time.monotonic() > deadline:
                raise RuntimeError(f"hotspare: {what}: not within {s.timeout_s:.0f} s")
            await asyncio.sleep(POLL_S)

    try:
        await until(lambda: sup.step >= 1, "the first step")
        start_s = time.time() - t0
        await until(lambda: sup.step >= s.kill_at, "kill_at")
        victim = _victim(folder, procs)
        last, epoch = sup.step, ctl.store.job("j").epoch
        kill_t = time.time()
        os.kill(victim, signal.SIGKILL)

        def first_step() -> float | None:
            for e in read(journal):
                if e.kind is Kind.INCIDENT and e.t > kill_t and e.data.get("phase") == "first_step":
                    return e.t
            return None

        await until(lambda: first_step() is not None, "the first step after the kill")
        t = first_step()
        assert t is not None
        resumed = [
            e["step"]
            for e in executor_events(folder / "a" / "jobs" / "j")
            if e.get("kind") == "resumed" and e.get("epoch", 0) > epoch
        ]
        lost = last - resumed[-1] if resumed else None
        return Trial("hotspare" if procs == 2 else "hotspare_1", start_s, t - kill_t, lost)
    finally:
        ctl.stop_job("j")
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 60)
        await ctl.close()


# ------------------------------------------------------------------ the run


def run(side: str, folder: Path, s: Settings) -> Trial:
    if side == "torchrun":
        return torchrun_trial(folder, s)
    return asyncio.run(hotspare_trial(folder, 2 if side == "hotspare" else 1, s))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="one trial")
    p.add_argument("--json", action="store_true")
    p.add_argument("--only", default=",".join(SIDES))
    p.add_argument("--kill-at", type=int, default=70)
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--step-time", type=float, default=0.05)
    a = p.parse_args()
    sides = [x for x in a.only.split(",") if x]
    if bad := [x for x in sides if x not in SIDES]:
        p.error(f"--only: unknown {', '.join(bad)} (known: {', '.join(SIDES)})")
    s = Settings(steps=a.steps, kill_at=a.kill_at, step_time=a.step_time)
    trials = 1 if a.quick else a.trials
    got: dict[str, list[Trial]] = {x: [] for x in sides}
    with tempfile.TemporaryDirectory(prefix="hotspare-local-ranks-") as tmp:
        for n in range(trials):
            order = sides[n % len(sides) :] + sides[: n % len(sides)]
            for side in order:
                t = run(side, Path(tmp) / f"{side}-{n}", s)
                print(
                    f"trial {n} {side}: start {t.start_s:.2f} s, recovered {t.recovered_s} s, "
                    f"lost {t.lost}",
                    file=sys.stderr,
                )
                got[side].append(t)
    figures: list[Figure] = []
    for side, ts in got.items():
        rec = [t.recovered_s for t in ts if t.recovered_s is not None]
        lost = [t.lost for t in ts if t.lost is not None]
        figures += [
            Figure(
                f"{side}: start to first step (median)",
                statistics.median(t.start_s for t in ts),
                "s",
            ),
            Figure(
                f"{side}: kill to first step after (median)",
                statistics.median(rec) if rec else float("nan"),
                "s",
            ),
            Figure(
                f"{side}: steps lost (median)",
                statistics.median(lost) if lost else float("nan"),
                "steps",
            ),
        ]
    if "torchrun" in got and "hotspare" in got:
        tr = [t.recovered_s for t in got["torchrun"] if t.recovered_s is not None]
        hs = [t.recovered_s for t in got["hotspare"] if t.recovered_s is not None]
        if tr and hs:
            ratio = statistics.median(hs) / statistics.median(tr)
            figures.append(Figure("hotspare / torchrun: kill to first step", ratio, "x"))
    notes = (
        f"2 hosts x 2 ranks on this machine (loopback), {trials} trial(s) each, sides "
        f"interleaved; rank 3 SIGKILLed once step {s.kill_at} is done; steps paced to "
        f">= {s.step_time:g} s; a checkpoint every {s.save_every} steps; torchrun: ddp_plain.py, "
        "--max-restarts 3, c10d rendezvous; hotspare: torch kind charlm, the shipped console "
        "settings (hotspare_1: one rank per host, the executor killed)"
    )
    emit("local_ranks", figures, notes, a.json)


if __name__ == "__main__":
    main()
