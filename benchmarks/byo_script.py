"""Bring your own script (issue 28): scripts that know nothing of hotspare, killed mid-run.

Two subjects, each a plain training script in tests/: ``train_nanogpt_style.py`` (nanoGPT's
way: ``--key=value`` flags, one ``ckpt.pt`` rewritten in place every ``eval_interval``
iterations, resumed by ``--init_from=resume``, a line ``iter N: loss L`` per iteration) and
``train_lightning.py`` (PyTorch Lightning: ``ModelCheckpoint`` files ``epoch=E-step=S.ckpt``
every 8 steps, ``fit(ckpt_path=...)``, a line ``step N loss L`` per step). Three scenarios,
each for both subjects; trials are interleaved (the order rotates each round):

- ``restart``: ``hotspare run --policy auto`` (a subprocess) on one local host, the script an
  ``executor = "command"`` job with only ``layout`` (and its flags) named, as in
  tests/console/test_byo_script.py and test_frameworks.py. Once the script has trained to
  ``kill_at`` and hotspare has published one of its checkpoints, its process (found in /proc:
  the one carrying the run's ``HOTSPARE_RUN_TOKEN`` of ``command.pgid`` and naming the
  script, checked against the pid of the executor's "command started" line) is SIGKILLed.
- ``torchrun``: the same script under ``python -m torch.distributed.run --standalone
  --nproc-per-node 1 --max-restarts 3``, its worker SIGKILLed at the same step. torchrun runs
  the same argv again, and neither script resumes by itself from a fixed argv (nanoGPT's
  ``--init_from=resume`` fails with no ``ckpt.pt``; Lightning's ``ckpt_path="last"`` finds
  nothing without ``save_last``, which this script does not set), so torchrun runs a five-line
  launcher (``LAUNCHER`` below, what a torchrun user writes) that adds the resume flag when a
  checkpoint is there (nanoGPT: ``--init_from=resume`` when ``ckpt.pt`` exists; Lightning:
  ``--ckpt-path`` the highest ``step=S`` file) and runs the script in its own interpreter
  with ``runpy`` (no second interpreter start).
- ``failover``: two local hosts, ``a`` (primary) and ``b`` (its spare); once a checkpoint is
  replicated to ``b`` and the script has trained to ``kill_at``, host ``a`` is killed as
  ``hotspare``'s own demo kill does (console/controller.py ``kill_host``): its killed
  mark written first (every console on this machine then finds ``a`` down; without it a
  local host stays reachable and the executor would be restarted in place on ``a``), then its
  executor and everything under it and in its cgroup frozen and SIGKILLed. No torchrun peer:
  torchrun does not move a job to another host.

Everything runs at hotspare's shipped defaults: each console setting the test fleet shortens
(fleetbed's FAST_CONSOLE) is put back to its ``console.inventory.ConsoleSettings`` value
(lease 10 s, heartbeat 1 s, suspect after 3 s and 3 missed heartbeats, clock skew 0.5 s,
unattended 60 s); the ``[command]`` table names no ``preload`` (``AUTO_PRELOAD``: forked from
the job's zygote), no ``settle_s`` (2 s), no ``keep_checkpoints``. The table names ``env``
(``OMP_NUM_THREADS=1``, as torchrun's workers get) and ``params_regex`` (a clean finish).
Each step sleeps 0.05 s (its compute, as in the tests). nanoGPT saves every 60 iterations
(``--eval_interval=60``, about 3 s), not the tests' 20: ``ckpt.pt`` is rewritten in place and
published only once it has stayed unchanged ``settle_s`` (2 s by default), so a file rewritten
every ~1 s is never published while the script runs (tried: eval_interval 20, 200 iterations,
the one checkpoint published at the script's exit, no warning), and a crash restarts it from
iteration 0. Lightning's files are new ones, each published 2 s after it is written: hotspare
resumes from an older checkpoint than the script's newest, which the lost steps show.

Everything is read from outside the supervisors. The kill time is taken just before the
SIGKILL (the killed mark, for a host). Lines are timestamped as they arrive: torchrun's
stdout read through a pipe by a thread; under hotspare the executor's ``events.jsonl`` in
the job's workdir on the host, tailed every 5 ms (its Log events carry no time of their
own), its ``stdout`` Log lines being the script's. The restarted run begins at the first
line after the kill that says so (hotspare: the executor's ``command started``; torchrun: the
launcher's ``launch pid=``); "first step" is the first progress line after that. Lost steps =
steps trained twice = the last step the killed script printed - the first step the restarted
one printed + 1 (the scripts' own numbering). For hotspare the journal's incident
(``first_step``) is shown beside, as hotspare counts it.

Goal (issue 28): a crash restart at most 0.5x torchrun's time.

    python benchmarks/byo_script.py [--trials 3] [--quick] [--json]
        [--only restart,torchrun,failover,nanogpt,lightning | SCENARIO:SCRIPT,...]
        [--keep DIR]
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
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any, TypeVar

ROOT = Path(__file__).resolve().parent.parent
HERE = ROOT / "benchmarks"
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from common import Figure, at_most, emit  # noqa: E402
from restart_vs_torchrun import (  # noqa: E402
    _cmdline,
    _end,
    _finish,
    _state,
    journal_first_step,
    last_journal_line,
)
from support.fleetbed import FAST_CONSOLE, local_host, write_inventory  # noqa: E402

from console.inventory import ConsoleSettings  # noqa: E402
from console.reach.transport import local_host as host_procs  # noqa: E402
from console.reach.transport.local import KILLED_MARK  # noqa: E402
from executors.agent.workdir import COMMAND_GROUP, PID, TOKEN_ENV  # noqa: E402

SHIPPED: dict[str, Any] = {k: getattr(ConsoleSettings(), k) for k in FAST_CONSOLE}
"""Every console setting fleetbed's FAST_CONSOLE shortens, back at its shipped value."""
SCENARIOS = ("restart", "torchrun", "failover")
SCENARIO_LABEL = {
    "restart": "crash restart, hotspare run",
    "torchrun": "crash restart, torchrun",
    "failover": "failover a -> b, hotspare run",
}
GOAL_RATIO = 0.5
PHASE_TIMEOUT_S = 300.0
RESTART_TIMEOUT_S = 120.0
POLL_S = 0.005
STEP_S = 0.05
"""Each script's sleep per step (``--iter_s``, ``--step-s``): a step's compute, as in the tests."""
ENV = {"OMP_NUM_THREADS": "1"}
PARAMS = r"^params sha256 (?P<sha256>[0-9a-f]{64})$"
T = TypeVar("T")

LAUNCHER = '''\
"""torchrun's worker: the script, with its resume flag when it has a checkpoint to resume."""
import os, re, runpy, sys

kind, ckpt, script, *args = sys.argv[1:]
names = os.listdir(ckpt) if os.path.isdir(ckpt) else []
extra = []
if kind == "nanogpt" and "ckpt.pt" in names:
    extra = ["--init_from=resume"]
steps = [(int(m[1]), n) for n in names if (m := re.search(r"step=(\\d+)\\.ckpt$", n))]
if kind == "lightning" and steps:
    extra = ["--ckpt-path", os.path.join(ckpt, max(steps)[1])]
print(f"launch pid={os.getpid()} resume={' '.join(extra) or 'none'}", flush=True)
sys.argv = [script, *args, *extra]
runpy.run_path(script, run_name="__main__")
'''


@dataclass(frozen=True)
class Subject:
    name: str
    script: Path
    progress: str
    """The script's progress line (group ``step``), as its job's ``progress_regex``."""
    every: int
    """Its checkpoint interval, in its steps."""
    kill_at: int
    steps: int

    def step(self, text: str) -> int | None:
        m = re.match(self.progress, text)
        return int(m["step"]) if m else None

    def own_argv(self, ckpt: str, steps: str) -> list[str]:
        """The script's argv after its path: its checkpoint folder and length."""
        if self.name == "nanogpt":
            return [
                f"--out_dir={ckpt}", f"--max_iters={steps}", f"--eval_interval={self.every}",
                f"--iter_s={STEP_S}",
            ]  # fmt: skip
        return ["--ckpt-dir", ckpt, "--max-steps", steps, "--step-s", str(STEP_S)]

    def command(self) -> dict[str, Any]:
        """The job's ``[command]`` table: ``layout`` and the script's own flags."""
        argv = [sys.executable, str(self.script), *self.own_argv("{checkpoint_dir}", "{steps}")]
        table: dict[str, Any] = {"env": ENV, "params_regex": PARAMS, "layout": self.name}
        if self.name == "lightning":
            argv += ["--ckpt-path", "{resume_from}"]
            table["progress_regex"] = self.progress
        return {"argv": argv, **table}


SUBJECTS = {
    "nanogpt": Subject(
        "nanogpt",
        ROOT / "tests" / "train_nanogpt_style.py",
        r"^iter (?P<step>\d+): loss (?P<loss>[0-9.]+)$",
        every=60,
        kill_at=100,
        steps=160,
    ),
    "lightning": Subject(
        "lightning",
        ROOT / "tests" / "train_lightning.py",
        r"^step (?P<step>\d+) loss (?P<loss>[0-9.]+)$",
        every=8,  # the script's ModelCheckpoint(every_n_train_steps=8)
        kill_at=60,
        steps=100,
    ),
}


@dataclass(frozen=True)
class Seen:
    """A line as it arrived: its kind (``stdout``, ``stderr``, a Log level, an event's kind)."""

    t: float
    kind: str
    text: str


class Feed:
    """Lines stamped with ``time.time()`` as they arrive, read by a thread of their own."""

    def __init__(self) -> None:
        self._seen: list[Seen] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _start(self, target: Callable[[], None]) -> Feed:
        self._thread = threading.Thread(target=target, daemon=True)
        self._thread.start()
        return self

    def _add(self, s: Seen) -> None:
        with self._lock:
            self._seen.append(s)

    def seen(self) -> list[Seen]:
        with self._lock:
            return list(self._seen)

    @classmethod
    def pipe(cls, stream: IO[bytes]) -> Feed:
        feed = cls()

        def read() -> None:
            for raw in iter(stream.readline, b""):
                feed._add(Seen(time.time(), "stdout", raw.decode(errors="replace").rstrip("\n")))

        return feed._start(read)

    @classmethod
    def events(cls, path: Path) -> Feed:
        """An executor's ``events.jsonl``, tailed every ``POLL_S`` (it may not exist yet)."""
        feed = cls()

        def tail() -> None:
            offset, rest = 0, b""
            while not feed._stop.is_set():
                try:
                    with open(path, "rb") as f:
                        f.seek(offset)
                        chunk = f.read()
                except FileNotFoundError:
                    chunk = b""
                t = time.time()
                offset += len(chunk)
                *lines, rest = (rest + chunk).split(b"\n")
                for line in lines:
                    with contextlib.suppress(ValueError):
                        feed._add(_event(t, json.loads(line)))
                time.sleep(POLL_S)

        return feed._start(tail)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)


def _event(t: float, e: dict[str, Any]) -> Seen:
    if e.get("kind") == "log":
        return Seen(t, str(e.get("level")), str(e.get("text")))
    if e.get("kind") == "checkpoint":
        return Seen(t, "checkpoint", str(e.get("manifest", {}).get("step")))
    return Seen(t, str(e.get("kind")), json.dumps(e))


@dataclass
class Trial:
    scenario: str
    subject: str
    kill_t: float
    killed_step: int
    """The last step the killed script printed."""
    resumed_step: int
    """The first step the restarted script printed."""
    started_t: float
    """The restarted run's first line (hotspare: ``command started``; torchrun: the
    launcher's, its interpreter up and torch not imported yet)."""
    first_t: float
    journal_s: float | None = None

    @property
    def seconds(self) -> float:
        return self.first_t - self.kill_t

    @property
    def lost(self) -> int:
        return self.killed_step - self.resumed_step + 1


def steps_of(seen: list[Seen], subject: Subject) -> list[int]:
    return [s for x in seen if x.kind == "stdout" and (s := subject.step(x.text)) is not None]


def restarted(
    seen: list[Seen], kill_t: float, begins: Callable[[Seen], bool], subject: Subject
) -> tuple[Seen, Seen, int] | None:
    """The restarted run's first line and first progress line, and the last step printed
    before that run began; None until it has printed a step."""
    i = next((i for i, x in enumerate(seen) if x.t >= kill_t and begins(x)), None)
    if i is None:
        return None
    first = next(
        (x for x in seen[i + 1 :] if x.kind == "stdout" and subject.step(x.text) is not None), None
    )
    if first is None:
        return None
    return seen[i], first, max(steps_of(seen[:i], subject), default=-1)


def wait_for(
    check: Callable[[], T | None], timeout_s: float, alive: Callable[[], bool], what: str
) -> T:
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value is not None:
            return value
        if not alive():
            raise RuntimeError(f"the supervisor exited before {what}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} within {timeout_s:g} s")
        time.sleep(POLL_S)


def _tail(seen: list[Seen], n: int = 2) -> str:
    return " | ".join(x.text[:160] for x in seen[-n:]) or "(nothing)"


def _env() -> dict[str, str]:
    env = {**os.environ, **ENV, "PYTHONUNBUFFERED": "1"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(ROOT), env.get("PYTHONPATH", "")] if p)
    return env


def _pids() -> list[int]:
    return [int(n) for n in os.listdir("/proc") if n.isdigit()]


def _live(pid: int) -> bool:
    return _state(pid) not in ("Z", "X")


# ------------------------------------------------------------------ torchrun


def torchrun_workers(launcher: Path) -> set[int]:
    """Live processes whose interpreter runs ``launcher`` (its first non-option argument: the
    torchrun agent's is ``torch.distributed.run``)."""
    found = set()
    for pid in _pids():
        argv = _cmdline(pid)
        if str(launcher) not in argv or not _live(pid):
            continue
        rest = [a for a in argv[1:] if not a.startswith("-")]
        if rest and rest[0] == str(launcher):
            found.add(pid)
    return found


def run_torchrun(folder: Path, subject: Subject) -> Trial:
    launcher, ckpt = folder / "launch.py", folder / "ckpt"
    launcher.write_text(LAUNCHER)
    argv = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
        "--nproc-per-node", "1", "--max-restarts", "3", str(launcher),
        subject.name, str(ckpt), str(subject.script),
        *subject.own_argv(str(ckpt), str(subject.steps)),
    ]  # fmt: skip
    with open(folder / "torchrun.err", "wb") as err:
        proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=err, env=_env(), cwd=folder,
            start_new_session=True,
        )  # fmt: skip
    assert proc.stdout is not None
    feed = Feed.pipe(proc.stdout)
    alive = lambda: proc.poll() is None  # noqa: E731
    try:
        wait_for(
            lambda: max(steps_of(feed.seen(), subject), default=-1) >= subject.kill_at or None,
            PHASE_TIMEOUT_S,
            alive,
            f"step {subject.kill_at}",
        )
        said = [x for x in feed.seen() if x.text.startswith("launch pid=")]
        pid = int(said[-1].text.split()[1].split("=")[1])
        found = torchrun_workers(launcher)
        if found != {pid}:
            raise RuntimeError(f"the launcher says pid {pid}, /proc shows {sorted(found)}")
        kill_t = time.time()
        os.kill(pid, signal.SIGKILL)
        started, first, killed = wait_for(
            lambda: restarted(
                feed.seen(), kill_t, lambda x: x.text.startswith("launch pid="), subject
            ),
            RESTART_TIMEOUT_S,
            alive,
            "step after the kill",
        )
        _finish(proc, "torchrun")
    except (RuntimeError, TimeoutError) as e:
        raise type(e)(f"{e}; torchrun's last lines: {_tail(feed.seen())}") from None
    finally:
        _end(proc)
        feed.close()
    return Trial(
        "torchrun", subject.name, kill_t, killed, subject.step(first.text) or 0, started.t, first.t
    )


# ------------------------------------------------------------------ hotspare


def _inventory(folder: Path, subject: Subject, spare: bool) -> Path:
    hosts = {"a": local_host(folder / "a")}
    job: dict[str, Any] = {
        "host": "a",
        "executor": "command",
        "steps": subject.steps,
        "command": subject.command(),
    }
    if spare:
        hosts["b"] = local_host(folder / "b", role="spare")
        job["spares"] = ["b"]
    return write_inventory(
        folder / "inventory.toml", hosts=hosts, jobs={"j": job}, regions=("r1",), **SHIPPED
    )


def _console(folder: Path, inv: Path) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "console.cli", "--inventory", str(inv), "run"]
    with open(folder / "hotspare.out", "wb") as out:
        return subprocess.Popen(
            [*argv, "--policy", "auto", "--json"], stdout=out, stderr=subprocess.STDOUT,
            env=_env(), cwd=ROOT, start_new_session=True,
        )  # fmt: skip


def ready_to_kill(feed: Feed, subject: Subject, replicas: Path | None) -> bool | None:
    """Trained to ``kill_at``, a checkpoint published (and replicated to the spare)."""
    seen = feed.seen()
    if max(steps_of(seen, subject), default=-1) < subject.kill_at:
        return None
    if not any(x.kind == "checkpoint" for x in seen):
        return None
    if replicas is not None and not any(replicas.glob("step-*.json")):
        return None
    return True


def run_process(workdir: Path, script: Path) -> set[int]:
    """Live processes carrying the recorded run's token that run ``script``."""
    try:
        token = json.loads((workdir / COMMAND_GROUP).read_bytes())["token"]
    except (OSError, ValueError, KeyError):
        return set()
    entry = f"{TOKEN_ENV}={token}".encode()
    found = set()
    for pid in _pids():
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if entry in env and str(script) in _cmdline(pid) and _live(pid):
            found.add(pid)
    return found


def _said_pid(seen: list[Seen]) -> int:
    said = [x for x in seen if x.kind == "info" and x.text.startswith("command started, pid ")]
    if not said:
        raise RuntimeError("no 'command started' line in events.jsonl")
    return int(said[-1].text.split()[3].rstrip(":"))


def _executors(root: Path, folder: Path) -> set[int]:
    """The live executors (and twins) a host's folder records, checked against /proc."""
    out = set()
    for pidfile in [*root.glob(f"jobs/*/{PID}"), *root.glob("jobs/*/twin.pid")]:
        with contextlib.suppress(OSError, ValueError):
            pid = int(pidfile.read_text().strip())
            if _live(pid) and any(str(folder) in a for a in _cmdline(pid)):
                out.add(pid)
    return out


def kill_host(root: Path, name: str, folder: Path) -> None:
    """As console/controller.py ``kill_host`` does for a local host, from outside: the
    killed mark first, then everything in its cgroup and under its executors."""
    (root / KILLED_MARK).write_text("killed by benchmarks/byo_script.py\n")
    host_procs.kill(host_procs.host_cgroup(name, str(root)), _executors(root, folder))


def run_hotspare(folder: Path, subject: Subject, failover: bool) -> Trial:
    inv = _inventory(folder, subject, spare=failover)
    a_dir, b_dir = folder / "a" / "jobs" / "j", folder / "b" / "jobs" / "j"
    feed_a = Feed.events(a_dir / "events.jsonl")
    feed_b = Feed.events(b_dir / "events.jsonl") if failover else feed_a
    replicas = folder / "b" / "replicas" / "j" if failover else None
    proc = _console(folder, inv)
    alive = lambda: proc.poll() is None  # noqa: E731
    try:
        what = f"step {subject.kill_at} and a published checkpoint" + (
            " replicated to b" if failover else ""
        )
        wait_for(lambda: ready_to_kill(feed_a, subject, replicas), PHASE_TIMEOUT_S, alive, what)
        pid = _said_pid(feed_a.seen())
        found = run_process(a_dir, subject.script)
        if found != {pid}:
            raise RuntimeError(f"the executor says pid {pid}, /proc shows {sorted(found)}")
        kill_t = time.time()
        if failover:
            kill_host(folder / "a", "a", folder)
        else:
            os.kill(pid, signal.SIGKILL)
        begins = lambda x: x.kind == "info" and x.text.startswith("command started")  # noqa: E731
        started, first, killed = wait_for(
            lambda: restarted(feed_b.seen(), kill_t, begins, subject),
            RESTART_TIMEOUT_S,
            alive,
            "step after the kill" + (" on b" if failover else ""),
        )
        if failover:  # b's file holds no step of a: the last one a printed
            killed = max(steps_of(feed_a.seen(), subject), default=-1)
        _finish(proc, "hotspare run")
    except (RuntimeError, TimeoutError) as e:
        raise type(e)(
            f"{e}; the script's last lines: {_tail(feed_b.seen())}; "
            f"hotspare's last word: {last_journal_line(folder)}"
        ) from None
    finally:
        _end(proc)
        feed_a.close()
        feed_b.close()
        for name in ("a", "b") if failover else ("a",):  # the executors outlive the console
            root = folder / name
            if not (root / KILLED_MARK).exists():
                host_procs.kill(host_procs.host_cgroup(name, str(root)), _executors(root, folder))
    scenario = "failover" if failover else "restart"
    trial = Trial(
        scenario, subject.name, kill_t, killed, subject.step(first.text) or 0, started.t, first.t
    )
    trial.journal_s = journal_first_step(inv, kill_t)
    return trial


RUNNERS: dict[str, Callable[[Path, Subject], Trial]] = {
    "restart": lambda folder, subject: run_hotspare(folder, subject, failover=False),
    "torchrun": run_torchrun,
    "failover": lambda folder, subject: run_hotspare(folder, subject, failover=True),
}


# ----------------------------------------------------------------------- main


def _fmt(x: float | None) -> str:
    return "" if x is None else f"{x:.2f}"


def print_trials(trials: list[Trial]) -> None:
    print(
        "| scenario | script | kill -> run started | -> first step | journal | killed at "
        "| first step after | lost |\n|---|---|---|---|---|---|---|---|"
    )
    for t in trials:
        print(
            f"| {SCENARIO_LABEL[t.scenario]} | {t.subject} | {t.started_t - t.kill_t:.2f} | "
            f"{t.seconds:.2f} | {_fmt(t.journal_s)} | {t.killed_step} | {t.resumed_step} | "
            f"{t.lost} |"
        )
    print()


@dataclass
class Results:
    by: dict[tuple[str, str], list[Trial]] = field(default_factory=dict)
    failed: dict[tuple[str, str], str] = field(default_factory=dict)


def figures(res: Results) -> list[Figure]:
    out: list[Figure] = []
    med: dict[tuple[str, str], float] = {}
    floor = SHIPPED["lease_s"] + SHIPPED["clock_skew_s"]
    for (scenario, name), trials in res.by.items():
        label = f"{SCENARIO_LABEL[scenario]}, {name}"
        if (scenario, name) in res.failed or not trials:
            bar = f"a step within {RESTART_TIMEOUT_S:g} s"
            out.append(Figure(f"{label}: kill -> first step (median)", math.nan, "s", bar, False))
            continue
        secs = [t.seconds for t in trials]
        med[scenario, name] = statistics.median(secs)
        out.append(Figure(f"{label}: kill -> first step (median)", med[scenario, name], "s"))
        out.append(Figure(f"{label}: spread (max - min)", max(secs) - min(secs), "s"))
        if scenario == "failover":
            beyond = med[scenario, name] - floor
            out.append(Figure(f"{label}: beyond lease + clock skew (median)", beyond, "s"))
        out.append(Figure(f"{label}: lost steps (max)", max(t.lost for t in trials), "steps"))
    for name in SUBJECTS:
        if ("restart", name) not in res.by or ("torchrun", name) not in res.by:
            continue
        r = med.get(("restart", name), math.nan) / med.get(("torchrun", name), math.nan)
        out.append(
            Figure(
                f"crash restart, {name}: hotspare / torchrun (medians)",
                r,
                "x",
                f"<= {GOAL_RATIO:g}",
                at_most(r, GOAL_RATIO),
            )
        )
    return out


def parse_only(text: str, ap: argparse.ArgumentParser) -> list[tuple[str, str]]:
    """``restart,nanogpt`` (every scenario named x every script named; naming none of a kind
    means all of it), or ``restart:nanogpt,failover:lightning`` pairs."""
    items = [s.strip() for s in text.split(",") if s.strip()]
    pairs = [tuple(s.split(":", 1)) for s in items if ":" in s]
    plain = [s for s in items if ":" not in s]
    scen = [s for s in plain if s in SCENARIOS]
    subj = [s for s in plain if s in SUBJECTS]
    bad = [s for s in plain if s not in SCENARIOS and s not in SUBJECTS]
    bad += [":".join(p) for p in pairs if p[0] not in SCENARIOS or p[1] not in SUBJECTS]
    if bad or not items:
        ap.error(f"--only: pick from {', '.join((*SCENARIOS, *SUBJECTS))} or SCENARIO:SCRIPT")
    chosen = [(a, b) for a, b in pairs] if pairs else []
    if plain:
        chosen += [(a, b) for a in scen or SCENARIOS for b in subj or SUBJECTS]
    return list(dict.fromkeys(chosen))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=3, help="per scenario and script")
    ap.add_argument(
        "--only",
        default=",".join(SCENARIOS),
        help=f"of: {', '.join((*SCENARIOS, *SUBJECTS))}, or SCENARIO:SCRIPT pairs",
    )
    ap.add_argument("--quick", action="store_true", help="1 trial each, fewer steps after the kill")
    ap.add_argument("--keep", type=Path, help="work in this new folder and keep it (logs)")
    ap.add_argument("--json", action="store_true", help="also print one JSON line last")
    args = ap.parse_args()
    if args.quick:
        args.trials = 1
    if args.trials < 1:
        ap.error("--trials >= 1")
    chosen = parse_only(args.only, ap)
    subjects = {
        k: replace(s, steps=s.kill_at + 20) if args.quick else s for k, s in SUBJECTS.items()
    }
    res = Results(by={c: [] for c in chosen})
    trials: list[Trial] = []
    try:
        with contextlib.ExitStack() as stack:
            if args.keep:
                args.keep.mkdir(parents=True)
                d = str(args.keep)
            else:
                base = os.environ.get("HOTSPARE_BENCH_DIR")
                d = stack.enter_context(tempfile.TemporaryDirectory(prefix="byo-", dir=base))
            for r in range(args.trials):
                order = chosen[r % len(chosen) :] + chosen[: r % len(chosen)]
                for scenario, name in order:
                    label = f"{SCENARIO_LABEL[scenario]}, {name}"
                    if (scenario, name) in res.failed:
                        continue
                    folder = Path(d) / f"{scenario}-{name}-{r}"
                    folder.mkdir()
                    try:
                        t = RUNNERS[scenario](folder, subjects[name])
                    except (RuntimeError, TimeoutError) as e:
                        # the others still run; this case's figure says it missed
                        res.failed[scenario, name] = f"{type(e).__name__}: {e}"
                        print(
                            f"round {r + 1}: {label}: {res.failed[scenario, name]}", file=sys.stderr
                        )
                        continue
                    res.by[scenario, name].append(t)
                    trials.append(t)
                    print(
                        f"round {r + 1}: {label}: kill -> first step {t.seconds:.2f} s, "
                        f"lost {t.lost} steps",
                        file=sys.stderr,
                        flush=True,
                    )
    except OSError as e:
        print(f"byo_script: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)
    print_trials(trials)
    shipped = ConsoleSettings()
    sub = "; ".join(
        f"{s.name}: {s.script.name}, checkpoint every {s.every} steps, SIGKILL at step "
        f"{s.kill_at} of {s.steps}"
        for k, s in subjects.items()
        if any(name == k for _, name in chosen)
    )
    notes = (
        f"{args.trials} interleaved trials each; {sub}; {STEP_S:g} s sleep a step, "
        f"OMP_NUM_THREADS=1; hotspare at its shipped defaults: lease {shipped.lease_s:g} s, "
        f"heartbeat {shipped.heartbeat_s:g} s, suspect after {shipped.suspect_after_s:g} s and "
        f"{shipped.missed_heartbeats} missed heartbeats, clock skew {shipped.clock_skew_s:g} s, "
        f"restart_limit {shipped.restart_limit}, [command] preload unset (AUTO_PRELOAD), "
        f"settle_s 2 s; local hosts; torchrun --max-restarts 3 with a resume launcher; "
        f"failover has no torchrun peer; cpu, {os.cpu_count()} CPUs"
    )
    for (scenario, name), why in res.failed.items():
        notes += f"; {SCENARIO_LABEL[scenario]}, {name} FAILED ({why})"
    emit("byo_script", figures(res), notes, args.json)


if __name__ == "__main__":
    main()
