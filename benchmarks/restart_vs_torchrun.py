"""Restart in place: hotspare against torchrun, the same plain script SIGKILLed mid-run.

The subject is benchmarks/restart_plain.py, which knows nothing of either supervisor: a
4-layer MLP (8.4M parameters) with Adam, a checkpoint of about 100 MB every 20 steps, resuming
from its newest checkpoint. Each trial starts it fresh under one supervisor, SIGKILLs the
training process once step 50 is done, and times the kill to the first step the restarted
script completes. Trials are interleaved (the order rotates each round):

- ``torchrun``: ``torchrun --standalone --nproc-per-node 1 --max-restarts 3 restart_plain.py``;
  the worker resumes from the newest checkpoint in its folder.
- ``command``: ``hotspare run --policy auto`` on one local host (lease 3 s, heartbeat
  0.25 s), the script as an ``executor = "command"`` job resuming from ``{resume_from}``, at
  the shipped defaults (``preload`` unset: ``AUTO_PRELOAD``, torch and torch._dynamo).
- ``command_exec``: the same job with ``preload = []``: every run exec'd (the default before).
- ``command_preload``: the same job with ``preload = ["torch"]``: each run is forked from the
  job's zygote, which has torch imported (executors/kinds/command/zygote.py), instead of exec'd.
- ``command_preload_dynamo``: ``preload = ["torch", "torch._dynamo"]``: the script's first
  optimizer imports ``torch._dynamo`` (some 800 modules, about as long as ``import torch``),
  which ``import torch`` leaves for later.
- ``torch``: the same model as a torch-kind workload (benchmarks/restart_workload.py), killed
  from inside the process that trains, whichever it is.
- ``torch_twin``: the torch kind with ``warm_twin = true``: the console keeps a warm twin (an
  idle executor, torch imported and warmed up) beside the executor; the kill waits until the
  twin has written ``twin.warm``, and the restart is a Start to the twin's process.
- ``torch_raise``: the same, but the run raises at step 50 instead (a crash of the training
  run, not of its process): the executor stays and restarts the run in place, in the process
  that has torch imported already; the "kill" time is the raise.

Everything is read from outside the supervisors: the training process is found in /proc (the
process running the script with this trial's log, checked against the pid the script itself
printed); the kill time is taken just before the SIGKILL; the first step after it and the step
it resumed from come from the script's own timestamped lines. Lost steps = the last step
completed before the kill - the step the restarted script loaded. For the hotspare kinds the
journal's incident (its ``first_step``) is shown beside, as hotspare counts it.

Goal (issue 13): the command kind at most 0.5x torchrun's time, the torch kind faster still.

    python benchmarks/restart_vs_torchrun.py [--trials 5] [--quick] [--json]
        [--only torchrun,command,command_preload,command_preload_dynamo,torch,torch_twin,
                torch_raise]
        [--width 1448]
        [--kill-at 50] [--save-every 20]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
HERE = ROOT / "benchmarks"
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from common import Figure, at_most, emit  # noqa: E402
from support.fleetbed import FAST_CONSOLE, local_host, write_inventory  # noqa: E402

SCRIPT = HERE / "restart_plain.py"
SUPERVISORS = (
    "torchrun",
    "command",
    "command_exec",
    "command_preload",
    "command_preload_dynamo",
    "torch",
    "torch_twin",
    "torch_raise",
)
PRELOAD = {
    "command_exec": [],
    "command_preload": ["torch"],
    "command_preload_dynamo": ["torch", "torch._dynamo"],
}
LABEL = {
    "torchrun": "torchrun --max-restarts 3",
    "command": "hotspare, command kind (defaults)",
    "command_exec": "hotspare, command kind, preload = [] (exec)",
    "command_preload": "hotspare, command kind, preload torch",
    "command_preload_dynamo": "hotspare, command kind, preload torch + torch._dynamo",
    "torch": "hotspare, torch kind",
    "torch_twin": "hotspare, torch kind with warm twin",
    "torch_raise": "hotspare, torch kind, run raises",
}
GOAL_RATIO = 0.5
PHASE_TIMEOUT_S = 300.0
RESTART_TIMEOUT_S = 120.0
POLL_S = 0.005
LINE = re.compile(r"^(?P<text>.*) pid=(?P<pid>\d+) t=(?P<t>[0-9.]+)$")


@dataclass(frozen=True)
class Settings:
    steps: int
    kill_at: int
    save_every: int
    width: int
    layers: int
    batch: int
    threads: int

    def script_args(self) -> list[str]:
        return [
            "--save-every", str(self.save_every), "--width", str(self.width),
            "--layers", str(self.layers), "--batch", str(self.batch),
        ]  # fmt: skip


@dataclass(frozen=True)
class Line:
    text: str
    pid: int
    t: float


@dataclass
class Trial:
    supervisor: str
    kill_t: float
    killed_step: int
    """The last step the killed process completed (its own last ``step N`` line)."""
    resumed_step: int
    """The step the restarted process loaded."""
    restarted_pid: int
    started_t: float | None
    """The restarted process's start: what it printed before importing torch, or else (the
    torch kind) its start time in /proc; it can precede the kill (a process kept warm)."""
    loaded_t: float
    first_t: float
    journal_s: float | None = None
    """hotspare's own figure: kill -> the incident's ``first_step`` in the journal."""

    @property
    def seconds(self) -> float:
        return self.first_t - self.kill_t

    @property
    def lost(self) -> int:
        return self.killed_step - self.resumed_step


# ------------------------------------------------------------------ the log


def read_log(path: Path) -> list[Line]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    out = []
    for raw in text.split("\n")[:-1]:  # the last part is a line still being written, or ""
        m = LINE.match(raw)
        if m:
            out.append(Line(m["text"], int(m["pid"]), float(m["t"])))
    return out


def last_step(lines: list[Line], pid: int | None = None) -> int:
    """The highest ``step N`` in ``lines`` (of process ``pid`` only, when given)."""
    return max(
        (
            int(ln.text.split()[1])
            for ln in lines
            if ln.text.startswith("step ") and pid in (None, ln.pid)
        ),
        default=0,
    )


def after_kill(lines: list[Line], kill_t: float, killed_pid: int) -> Trial | None:
    """The restarted process's timeline, once it has completed a step; None until then."""
    fresh = [ln for ln in lines if ln.pid != killed_pid and ln.t >= kill_t]
    loaded = next((ln for ln in fresh if ln.text.startswith("loaded step=")), None)
    if loaded is None:
        return None
    first = next((ln for ln in fresh if ln.pid == loaded.pid and ln.text.startswith("step ")), None)
    if first is None:
        return None
    started = next(
        (ln for ln in fresh if ln.pid == loaded.pid and ln.text.startswith("proc t0=")), None
    )
    return Trial(
        supervisor="",
        kill_t=kill_t,
        killed_step=last_step(lines, killed_pid),
        resumed_step=int(loaded.text.split("=")[1]),
        restarted_pid=loaded.pid,
        started_t=float(started.text.split("=")[1]) if started else None,
        loaded_t=loaded.t,
        first_t=first.t,
    )


def _tail(path: Path, n: int = 2) -> str:
    try:
        return " | ".join(path.read_text().splitlines()[-n:])
    except OSError:
        return "(no log)"


# ------------------------------------------------------- the training process


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def _state(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return "X"
    return raw[raw.rfind(b")") + 2 :].split()[0].decode()


def started_at(pid: int) -> float | None:
    """When process ``pid`` started, wall clock (to the kernel's clock tick), from /proc: its
    start in ticks since boot, against CLOCK_BOOTTIME now (``btime`` is whole seconds)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    since_boot = int(raw[raw.rfind(b")") + 2 :].split()[19]) / os.sysconf("SC_CLK_TCK")
    return time.time() - (time.clock_gettime(time.CLOCK_BOOTTIME) - since_boot)


def script_processes(log: Path) -> set[int]:
    """Live processes running restart_plain.py with this trial's log: the interpreter's first
    non-option argument is the script (so torchrun's agent, whose argv also names it, is not)."""
    found = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        argv = _cmdline(int(name))
        if str(log) not in argv or _state(int(name)) in ("Z", "X"):
            continue
        rest = [a for a in argv[1:] if not a.startswith("-")]
        if rest and Path(rest[0]).name == SCRIPT.name:
            found.add(int(name))
    return found


def kill_trainer(
    log: Path, settings: Settings, deadline: float, alive: Callable[[], bool]
) -> tuple[float, int]:
    """Wait for step ``kill_at``, find the script's process, SIGKILL it; (time, pid)."""
    while True:
        lines = read_log(log)
        if last_step(lines) >= settings.kill_at:
            said = lines[-1].pid
            found = script_processes(log)
            if found != {said}:
                raise RuntimeError(
                    f"the script says pid {said}, /proc shows {sorted(found) or 'none'} running it"
                )
            t = time.time()
            os.kill(said, signal.SIGKILL)
            return t, said
        if not alive():
            raise RuntimeError(
                f"the supervisor exited before step {settings.kill_at}: {_tail(log)}"
            )
        if time.monotonic() > deadline:
            raise TimeoutError(f"no step {settings.kill_at} in time: {_tail(log)}")
        time.sleep(POLL_S)


def wait_restart(
    log: Path, kill_t: float, pid: int, deadline: float, alive: Callable[[], bool]
) -> Trial:
    while True:
        trial = after_kill(read_log(log), kill_t, pid)
        if trial is not None:
            if trial.started_t is None:  # the torch kind prints nothing before its first batch
                trial.started_t = started_at(trial.restarted_pid)
            return trial
        if not alive():
            raise RuntimeError(f"the supervisor exited before a restarted step: {_tail(log)}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"no step within {RESTART_TIMEOUT_S:g} s of the kill: {_tail(log)}")
        time.sleep(POLL_S)


# ---------------------------------------------------------------- supervisors


def _env(settings: Settings) -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": str(settings.threads), "PYTHONUNBUFFERED": "1"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(ROOT), env.get("PYTHONPATH", "")] if p)
    return env


def _alive(proc: subprocess.Popen[bytes]) -> Callable[[], bool]:
    return lambda: proc.poll() is None


def _finish(proc: subprocess.Popen[bytes], what: str) -> None:
    """Wait for the supervisor to finish the job (exit 0); otherwise end its group and fail."""
    try:
        rc = proc.wait(timeout=PHASE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        rc = None
    if rc != 0:
        _end(proc)
        raise RuntimeError(f"{what} did not finish the job (exit {rc})")


def _end(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def run_torchrun(folder: Path, settings: Settings) -> Trial:
    log = folder / "steps.log"
    torchrun = Path(sys.executable).with_name("torchrun")
    launcher = (
        [str(torchrun)] if torchrun.exists() else [sys.executable, "-m", "torch.distributed.run"]
    )
    argv = [
        *launcher, "--standalone", "--nnodes", "1", "--nproc-per-node", "1",
        "--max-restarts", "3", str(SCRIPT),
        "--checkpoint-dir", str(folder / "ckpt"), "--steps", str(settings.steps),
        *settings.script_args(), "--step-log", str(log),
    ]  # fmt: skip
    with open(folder / "torchrun.out", "wb") as out:
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, env=_env(settings), cwd=folder,
            start_new_session=True,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + PHASE_TIMEOUT_S
        alive = _alive(proc)
        kill_t, pid = kill_trainer(log, settings, deadline, alive)
        trial = wait_restart(log, kill_t, pid, time.monotonic() + RESTART_TIMEOUT_S, alive)
        _finish(proc, "torchrun")
    finally:
        _end(proc)
    trial.supervisor = "torchrun"
    return trial


def _inventory(folder: Path, job: dict[str, Any]) -> Path:
    return write_inventory(
        folder / "inventory.toml",
        hosts={"a": local_host(folder / "a")},
        jobs={"j": {"host": "a", **job}},
        regions=("r1",),
    )


def _hotspare(folder: Path, inv: Path, host_env: dict[str, str], settings: Settings):
    env = _env(settings)
    env["HOTSPARE_EXECUTOR_ENV"] = json.dumps({"a": host_env})
    argv = [sys.executable, "-m", "console.cli", "--inventory", str(inv), "run"]
    with open(folder / "hotspare.out", "wb") as out:
        return subprocess.Popen(
            [*argv, "--policy", "auto", "--json"], stdout=out, stderr=subprocess.STDOUT,
            env=env, cwd=ROOT, start_new_session=True,
        )  # fmt: skip


def journal_first_step(inv: Path, kill_t: float) -> float | None:
    from console.records.incidents import incidents
    from console.records.journal import read

    try:
        found = [i for i in incidents(read(inv.parent / "state" / "journal.jsonl")) if i.resolved]
    except (OSError, ValueError):
        return None
    return found[0].times["first_step"] - kill_t if found else None


def last_journal_line(folder: Path) -> str:
    """The newest journal event ``hotspare run --json`` printed, for a failure's message."""
    try:
        lines = (folder / "hotspare.out").read_text().splitlines()
    except OSError:
        return "(no output)"
    for raw in reversed(lines):
        with contextlib.suppress(ValueError):
            return str(json.loads(raw).get("msg", raw))
    return lines[-1] if lines else "(no output)"


def run_command(folder: Path, settings: Settings, kind: str = "command") -> Trial:
    log = folder / "steps.log"
    argv = [
        sys.executable, str(SCRIPT), "--checkpoint-dir", "{checkpoint_dir}",
        "--resume", "{resume_from}", "--steps", "{steps}", *settings.script_args(),
        "--step-log", str(log),
    ]  # fmt: skip
    command = {
        "argv": argv,
        "env": {"OMP_NUM_THREADS": str(settings.threads)},
        "checkpoint_glob": "ckpt-*.pt",
        "complete_marker": "{name}.done",
        "progress_regex": r"^step (?P<step>\d+) loss=(?P<loss>[0-9.]+)",
    }
    if kind in PRELOAD:
        command["preload"] = PRELOAD[kind]
    job = {
        "executor": "command",
        "steps": settings.steps,
        "keep_checkpoints": 2,
        "command": command,
    }
    inv = _inventory(folder, job)
    proc = _hotspare(folder, inv, {"OMP_NUM_THREADS": str(settings.threads)}, settings)
    try:
        deadline = time.monotonic() + PHASE_TIMEOUT_S
        alive = _alive(proc)
        kill_t, pid = kill_trainer(log, settings, deadline, alive)
        trial = wait_restart(log, kill_t, pid, time.monotonic() + RESTART_TIMEOUT_S, alive)
        _finish(proc, "hotspare run")
    except (RuntimeError, TimeoutError) as e:
        raise type(e)(f"{e}; hotspare's last word: {last_journal_line(folder)}") from None
    finally:
        _end(proc)
    trial.supervisor = kind
    trial.journal_s = journal_first_step(inv, kill_t)
    return trial


def run_torch(folder: Path, settings: Settings, crash: str = "kill", twin: bool = False) -> Trial:
    """The torch kind; ``crash``: kill (SIGKILL the executor, which trains in-process) or
    raise (the run raises; the executor restarts it in place, in the same process). ``twin``:
    with a warm twin, warmed up before the kill."""
    from protocol.version import source_hash

    log, marker = folder / "steps.log", folder / "killed"
    config = {
        "width": settings.width,
        "layers": settings.layers,
        "batch": settings.batch,
        "log": str(log),
        "kill_at": settings.kill_at,
        "marker": str(marker),
        "crash": crash,
    }
    if twin:
        config["kill_gate"] = str(folder / "a" / "jobs" / "j" / "twin.warm")
    job = {
        "executor": "torch",
        "workload": "restart_workload:build",
        "steps": settings.steps,
        "seed": 1,
        "checkpoint_every_steps": settings.save_every,
        "keep_checkpoints": 2,
        "config": config,
        **({"warm_twin": True} if twin else {}),
    }
    inv = _inventory(folder, job)
    # the executor's own PYTHONPATH (its deployed bundle), and benchmarks/ for the workload
    bundle = folder / "a" / "bundles" / source_hash(ROOT)
    host_env = {
        "OMP_NUM_THREADS": str(settings.threads),
        "PYTHONPATH": os.pathsep.join([str(bundle), str(HERE)]),
    }
    proc = _hotspare(folder, inv, host_env, settings)
    try:
        deadline = time.monotonic() + PHASE_TIMEOUT_S
        while not marker.exists() or not marker.read_text().endswith("\n"):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"no kill at step {settings.kill_at}: {_tail(log)}")
            time.sleep(POLL_S)
        kill_t = float(marker.read_text())
        before = [ln for ln in read_log(log) if ln.t <= kill_t]
        killed = before[-1].pid
        # raised in place: the same process goes on, so no pid is left out of what follows
        trial = wait_restart(
            log,
            kill_t,
            killed if crash == "kill" else -1,
            time.monotonic() + RESTART_TIMEOUT_S,
            _alive(proc),
        )
        if crash == "raise":
            trial.killed_step = last_step(before, killed)
            trial.started_t = kill_t  # nothing started: the process was up all along
        _finish(proc, "hotspare run")
    except (RuntimeError, TimeoutError) as e:
        raise type(e)(f"{e}; hotspare's last word: {last_journal_line(folder)}") from None
    finally:
        _end(proc)
    trial.supervisor = "torch_raise" if crash == "raise" else "torch_twin" if twin else "torch"
    trial.journal_s = journal_first_step(inv, kill_t)
    return trial


RUNNERS = {
    "torchrun": run_torchrun,
    "command": run_command,
    **{
        k: lambda folder, settings, k=k: run_command(folder, settings, k)
        for k in ("command_exec", "command_preload", "command_preload_dynamo")
    },
    "torch": run_torch,
    "torch_twin": lambda folder, settings: run_torch(folder, settings, twin=True),
    "torch_raise": lambda folder, settings: run_torch(folder, settings, crash="raise"),
}


# ----------------------------------------------------------------------- main


def _fmt(x: float | None) -> str:
    return "" if x is None else f"{x:.2f}"


def print_trials(trials: list[Trial]) -> None:
    print(
        "| supervisor | kill -> process up | -> loaded | -> first step | journal | killed at "
        "| resumed at | lost |\n|---|---|---|---|---|---|---|---|"
    )
    for t in trials:
        up = None if t.started_t is None else t.started_t - t.kill_t
        print(
            f"| {LABEL[t.supervisor]} | {_fmt(up)} | {_fmt(t.loaded_t - t.kill_t)} | "
            f"{t.seconds:.2f} | {_fmt(t.journal_s)} | {t.killed_step} | {t.resumed_step} | "
            f"{t.lost} |"
        )
    print()


def figures(by: dict[str, list[Trial]], failed: dict[str, str], settings: Settings) -> list[Figure]:
    out: list[Figure] = []
    med = {
        k: statistics.median(t.seconds for t in v) for k, v in by.items() if v and k not in failed
    }
    for k, trials in by.items():
        if k in failed:  # a supervisor that did not restart the script is a miss, not a gap
            bar = f"a step within {RESTART_TIMEOUT_S:g} s"
            out.append(
                Figure(f"{LABEL[k]}: kill -> first step (median)", math.nan, "s", bar, False)
            )
            continue
        secs = [t.seconds for t in trials]
        out.append(Figure(f"{LABEL[k]}: kill -> first step (median)", med[k], "s"))
        out.append(Figure(f"{LABEL[k]}: spread (max - min)", max(secs) - min(secs), "s"))
        lost = max(t.lost for t in trials)
        every = settings.save_every
        out.append(
            Figure(
                f"{LABEL[k]}: lost steps (max)", lost, "steps", f"<= {every}", at_most(lost, every)
            )
        )
    base = med.get("torchrun", math.nan)
    for k in SUPERVISORS[1:]:
        if k not in by or "torchrun" not in by:
            continue
        r = med.get(k, math.nan) / base
        ok = at_most(r, GOAL_RATIO)
        bar = f"<= {GOAL_RATIO:g}"
        if not k.startswith("command"):
            ok = ok and med[k] < med.get("command", math.inf)
            bar += ", < the command kind's" if "command" in by else ""
        out.append(Figure(f"{LABEL[k]} / torchrun (medians)", r, "x", bar, ok))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=5, help="per supervisor")
    ap.add_argument("--only", default=",".join(SUPERVISORS), help="of: " + ", ".join(SUPERVISORS))
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--kill-at", type=int, default=50)
    ap.add_argument("--save-every", type=int, default=20)
    ap.add_argument("--width", type=int, default=1448, help="1448: 8.4M parameters, ~100 MB")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of every trainer")
    ap.add_argument("--keep", type=Path, help="work in this new folder and keep it (logs)")
    ap.add_argument("--quick", action="store_true", help="1 trial each")
    ap.add_argument("--json", action="store_true", help="also print one JSON line last")
    args = ap.parse_args()
    if args.quick:
        args.trials = 1
    chosen = [s.strip() for s in args.only.split(",") if s.strip()]
    if not chosen or any(s not in SUPERVISORS for s in chosen):
        ap.error(f"--only: pick from {', '.join(SUPERVISORS)}")
    if not 0 < args.kill_at < args.steps or args.trials < 1:
        ap.error("need 0 < --kill-at < --steps and --trials >= 1")
    settings = Settings(
        args.steps, args.kill_at, args.save_every, args.width, args.layers, args.batch,
        args.threads,
    )  # fmt: skip
    params = args.layers * (args.width * args.width + args.width)
    by: dict[str, list[Trial]] = {k: [] for k in chosen}
    trials: list[Trial] = []
    failed: dict[str, str] = {}
    try:
        with contextlib.ExitStack() as stack:
            if args.keep:
                args.keep.mkdir(parents=True)
                d = str(args.keep)
            else:
                base = os.environ.get("HOTSPARE_BENCH_DIR")
                d = stack.enter_context(tempfile.TemporaryDirectory(prefix="rvt-", dir=base))
            for r in range(args.trials):
                order = chosen[r % len(chosen) :] + chosen[: r % len(chosen)]
                for k in order:
                    if k in failed:
                        continue
                    folder = Path(d) / f"{k}-{r}"
                    folder.mkdir()
                    try:
                        t = RUNNERS[k](folder, settings)
                    except (RuntimeError, TimeoutError) as e:
                        # the others still run; this supervisor's figure says it missed
                        failed[k] = f"{type(e).__name__}: {e}"
                        print(f"round {r + 1}: {LABEL[k]}: {failed[k]}", file=sys.stderr)
                        continue
                    by[k].append(t)
                    trials.append(t)
                    print(
                        f"round {r + 1}: {LABEL[k]}: kill -> first step {t.seconds:.2f} s, "
                        f"lost {t.lost} steps",
                        file=sys.stderr,
                        flush=True,
                    )
    except OSError as e:
        print(f"restart_vs_torchrun: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)
    print_trials(trials)
    notes = (
        f"{args.trials} interleaved trials each; restart_plain.py: {args.layers}-layer MLP, "
        f"{params / 1e6:.1f}M parameters + Adam (checkpoint ~{params * 12 / 1e6:.0f} MB every "
        f"{args.save_every} steps), SIGKILL once step {args.kill_at} is done, {args.steps} "
        f"steps, batch {args.batch}, OMP_NUM_THREADS={args.threads}; hotspare: one local host, "
        f"lease {FAST_CONSOLE['lease_s']:g} s, heartbeat {FAST_CONSOLE['heartbeat_s']:g} s; "
        f"cpu, {os.cpu_count()} CPUs"
    )
    for k, why in failed.items():
        notes += f"; {LABEL[k]} FAILED ({why})"
    emit("restart_vs_torchrun", figures(by, failed, settings), notes, args.json)


if __name__ == "__main__":
    main()
