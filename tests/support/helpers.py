"""Shared test helpers: job specs on disk, executor processes, waiting on conditions."""

from __future__ import annotations

import ast
import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import tomli_w

from support.wait import wait_for as wait_for  # re-exported: the tests import it from here too

EXECUTOR = [sys.executable, "-m", "executors.cli"]
REPO = Path(__file__).resolve().parents[2]

TINY_CONFIG = {
    "n_layer": 1,
    "n_head": 2,
    "n_embd": 32,
    "block_size": 32,
    "global_batch": 8,
    "dropout": 0.1,
    "corpus_chars": 20_000,
}


def write_spec(path: Path, **overrides: Any) -> Path:
    """A small job spec that trains in a second or two on a CPU."""
    spec: dict[str, Any] = {
        "name": "tiny",
        "workload": "charlm",
        "steps": 80,
        "seed": 7,
        "checkpoint_every_steps": 10,
        "keep_checkpoints": 3,
        "config": dict(TINY_CONFIG),
    }
    config = overrides.pop("config", {})
    spec.update(overrides)
    spec["config"].update(config)
    path.write_text(tomli_w.dumps(spec))
    return path


def env_with(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault(
        "OMP_NUM_THREADS", "1"
    )  # tiny models: one thread is faster, and runs compare alike
    env.update(extra)
    return env


class ExecutorProcess:
    """``hotspare-executor`` in a subprocess, its ``--json`` events collected as they arrive."""

    def __init__(self, args: list[str], env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            [*EXECUTOR, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env or env_with(),
            cwd=REPO,
        )
        self.events: list[dict[str, Any]] = []
        self.returncode: int | None = None
        self.stderr = ""
        self._cond = threading.Condition()
        self._err: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._err_reader = threading.Thread(target=self._read_err, daemon=True)
        self._err_reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._cond:
                self.events.append(json.loads(line))
                self._cond.notify_all()

    def _read_err(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self._err.append(line)

    def wait_event(
        self, predicate: Callable[[dict[str, Any]], bool], timeout: float, what: str
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for ev in self.events:
                    if predicate(ev):
                        return ev
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not self._reader.is_alive()):
                    raise AssertionError(
                        f"no event {what} within {timeout}s (exit {self.proc.poll()})"
                    )
                self._cond.wait(min(left, 0.2))

    def finish(self, timeout: float = 120) -> tuple[int, str]:
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise
        self._reader.join(timeout=5)
        self._err_reader.join(timeout=5)
        self.returncode, self.stderr = self.proc.returncode, "".join(self._err)
        err = self.stderr
        return self.returncode, err

    def of(self, kind: str) -> list[dict[str, Any]]:
        with self._cond:
            return [e for e in self.events if e["kind"] == kind]


def run_job(
    spec: Path, workdir: Path, *, env: dict[str, str] | None = None, timeout: float = 120
) -> ExecutorProcess:
    """Run ``hotspare-executor run --json`` to its end; the finished process, its events collected."""
    proc = ExecutorProcess(
        ["run", "--spec", str(spec), "--workdir", str(workdir), "--json"], env=env
    )
    proc.finish(timeout)
    return proc


# A command with a child and a grandchild that ignore SIGTERM (like torchrun's workers or a
# DataLoader's): argv ROLE OUT, each writes OUT/ROLE.pid; the leader prints progress.
WORKER_TREE = r"""
import os, signal, subprocess, sys, time
from pathlib import Path

role, out = sys.argv[1], Path(sys.argv[2])
if role != "leader":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
nxt = {"leader": "child", "child": "grandchild"}.get(role)
if nxt:
    subprocess.Popen([sys.executable, __file__, nxt, str(out)], stdout=subprocess.DEVNULL)
tmp = out / f".{role}.pid"
tmp.write_text(str(os.getpid()))
os.replace(tmp, out / f"{role}.pid")
step = 0
while role == "leader":
    step += 1
    print(f"step {step} loss 0.5", flush=True)
    time.sleep(0.05)
while True:
    signal.pause()
"""


def worker_tree_pids(folder: Path) -> dict[str, int] | None:
    """The pids a WORKER_TREE wrote into ``folder``, by role; None until all three did."""
    try:
        return {
            r: int((folder / f"{r}.pid").read_text()) for r in ("leader", "child", "grandchild")
        }
    except (OSError, ValueError):
        return None


PLAIN_SCRIPT = REPO / "tests" / "train_plain.py"
"""A plain PyTorch training script that knows nothing of hotspare (the ``command`` kind's subject)."""


def plain_command(step_s: float = 0.02) -> dict[str, Any]:
    """The ``[command]`` table that runs PLAIN_SCRIPT: complete-marker checkpoints, progress and
    the final params digest read from its output."""
    argv = [sys.executable, str(PLAIN_SCRIPT), "--checkpoint-dir", "{checkpoint_dir}"]
    argv += ["--resume", "{resume_from}", "--steps", "{steps}", "--marker"]
    return {
        "argv": [*argv, "--step-s", str(step_s)],
        "env": {"OMP_NUM_THREADS": "1"},
        "checkpoint_glob": "ckpt-*.pt",
        "complete_marker": "{name}.done",
        "progress_regex": r"step (?P<step>\d+) loss (?P<loss>[0-9.]+)",
        "params_regex": r"^params sha256 (?P<sha256>[0-9a-f]{64})$",
    }


def maps_torch(pid: int) -> bool:
    """Has this process mapped torch's native library? (/proc, not the process's word)"""
    return "libtorch" in Path(f"/proc/{pid}/maps").read_text()


@contextlib.contextmanager
def tmpfs(where: Path, size: str) -> Iterator[Path]:
    """A real small disk: a tmpfs of ``size`` mounted at ``where`` (made), unmounted after. The
    suite runs as root (CI too), so a mount that fails is a failure, never a skip."""
    where.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if done.returncode != 0:
        raise AssertionError(
            f"cannot mount a tmpfs (the suite runs as root): {done.stderr.strip()}"
        )
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True, timeout=30)


def fill_disk(disk: Path) -> Path:
    """Fill a (small) disk to the last byte with one file; that file."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for size in (1 << 20, 4096, 1):
            with contextlib.suppress(OSError):
                while os.write(fd, b"\0" * size):
                    pass
    finally:
        os.close(fd)
    assert os.statvfs(disk).f_bavail == 0
    return filler


def command_pid(workdir: Path) -> int | None:
    """The process-group leader of the command an executor runs, as it recorded it in its
    workdir (None before it recorded one)."""
    from executors.agent.workdir import read_command

    rec = read_command(workdir)
    return rec[0] if rec is not None else None


def alive(pid: int) -> bool:
    """A live process (not a zombie), from /proc."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return raw[raw.rfind(b")") + 2 :].split()[0] not in (b"Z", b"X")


def serving(workdir: Path) -> list[int]:
    """The live executor processes serving ``workdir`` (``serve --workdir WORKDIR`` in their
    argv), from /proc: a pid file outlives a SIGKILLed executor, so it is no evidence."""
    where = os.path.normpath(workdir)
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            args = Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        argv = args.split("\0")
        if "serve" in argv and "--workdir" in argv:
            i = argv.index("--workdir")
            if i + 1 < len(argv) and os.path.normpath(argv[i + 1]) == where and alive(int(entry)):
                found.append(int(entry))
    return found


def cgroup_here() -> str | None:
    """Whether a run started by this process could get a cgroup with ``cgroup.kill``, found by
    trying (a child cgroup made and removed beside this process's own): None if so, else why."""
    mount = next(
        (
            Path(left.split()[4])
            for left, _, right in (
                line.partition(" - ")
                for line in Path("/proc/self/mountinfo").read_text().splitlines()
            )
            if right.split()[:1] == ["cgroup2"]
        ),
        None,
    )
    if mount is None:
        return "no cgroup2 mount"
    own = [
        line[3:] for line in Path("/proc/self/cgroup").read_text().splitlines() if line[:3] == "0::"
    ]
    trial = mount / own[0].lstrip("/") / f"hs-trial-{os.getpid()}"
    try:
        trial.mkdir()
    except OSError as e:
        return str(e)
    try:
        return None if (trial / "cgroup.kill").exists() else "no cgroup.kill"
    finally:
        trial.rmdir()


def parsed(path: Path) -> ast.Module:
    """``path``'s syntax tree. Python 3.11's AST constructor keeps its recursion depth per
    interpreter, not per thread: a parse here while another thread of this worker compiled a
    module (an import: no .pyc is written where PYTHONDONTWRITEBYTECODE is set) failed with
    "SystemError: AST constructor recursion depth mismatch" (CPython gh-106905; a fresh-clone
    run). The parse is the test's tool, not its subject: asked again once."""
    text = path.read_text()
    try:
        return ast.parse(text)
    except SystemError:
        return ast.parse(text)
