"""The command kind's process plumbing: argv and env from the spec, the launch, the output.

A command never reaches a shell: its argv is a list, placeholders are replaced inside each
element once (a replaced value is never scanned again), and it is exec'd without a shell by
its fence (``executors.fencing``): every process the command starts, whatever session it
moves to, ends with the run, and no later than its lease, even when the executor is killed
(its successor on the same host would otherwise train beside it).

Output lines become ``Log`` events with level ``stdout`` or ``stderr``, each cut to
``MAX_LINE_CHARS`` and at most ``LINES_PER_S`` a second (a burst of ``LINE_BURST``); the lines
over the rate are counted and reported as one line. Progress is parsed from every line.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING

import executors
from executors.agent import run_env
from executors.agent.workdir import TOKEN_ENV, new_token, record_command
from executors.fencing import cgroup
from executors.fencing import run as fencing
from executors.fencing.publish import Emit, LeaseCheck
from executors.fencing.run import FencedRun
from protocol.errors import ConfigError
from protocol.messages import Log, LogLevel, Progress, Rendezvous

if TYPE_CHECKING:
    from executors.kinds.command.zygote import ForkedRun

MAX_LINE_CHARS = 2000
MAX_LINE_BYTES = 64 << 10
LINES_PER_S = 50.0
LINE_BURST = 500
PLACEHOLDER = re.compile(
    r"\{(checkpoint_dir|resume_from|step|steps|seed|workdir|node_rank|nnodes|master_addr"
    r"|master_port|rank|world_size|local_world_size|backend|timeout_s|run_id|job|epoch)\}"
)
RESUME = "{resume_from}"
ALONE = Rendezvous(node_rank=0, addresses=["127.0.0.1"], master_port=29500)
"""Where a job without a rendezvous (one host) meets itself: torchrun's own defaults."""


def substitute(text: str, values: dict[str, str]) -> str:
    return PLACEHOLDER.sub(lambda m: values[m.group(1)], text)


def per_run_names(env_table: dict[str, str]) -> set[str]:
    """Variables whose value changes between runs of one job: ``env`` entries holding a
    placeholder, and the run's identity (``executors.agent.run_env``). What was readied for a job
    (its zygote, its setup) is not redone for them."""
    return {k for k, v in env_table.items() if PLACEHOLDER.search(v)} | run_env.NAMES


def group_values(rendezvous: Rendezvous | None) -> dict[str, str]:
    """The placeholders of the group this host trains in: ``{rank}`` is this host's first global
    rank, the one torchrun's ``--node-rank`` times ``--nproc-per-node`` gives its local rank 0."""
    r = rendezvous or ALONE
    return {
        "node_rank": str(r.node_rank),
        "nnodes": str(r.nnodes),
        "master_addr": r.master_addr,
        "master_port": str(r.master_port),
        "rank": str(r.node_rank * r.procs_per_host),
        "world_size": str(r.world_size),
        "local_world_size": str(r.procs_per_host),
        "backend": r.backend,
        "timeout_s": f"{r.timeout_s:g}",
    }


def build_argv(template: list[str], values: dict[str, str]) -> list[str]:
    """The argv to run: placeholders replaced; with nothing to resume from, the resume pieces left out."""
    drop: set[int] = set()
    if not values["resume_from"]:
        for i, element in enumerate(template):
            if i > 0 and RESUME in element:
                drop.add(i)
                if element == RESUME and i > 1 and template[i - 1].startswith("-"):
                    drop.add(i - 1)
    return [substitute(e, values) for i, e in enumerate(template) if i not in drop]


def command_env(
    extra: dict[str, str], values: dict[str, str], run: dict[str, str] | None = None
) -> dict[str, str]:
    """The executor's environment, unbuffered Python output, the bundle off ``PYTHONPATH`` (its
    ``executors`` and ``protocol`` packages must not shadow the command's), the run's identity
    (``run``: ``executors.agent.run_env``), then ``extra``."""
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(run or {})
    bundle = Path(executors.__file__).resolve().parent.parent
    paths = [
        p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p).resolve() != bundle
    ]
    if paths:
        env["PYTHONPATH"] = os.pathsep.join(paths)
    else:
        env.pop("PYTHONPATH", None)
    env.update({k: substitute(v, values) for k, v in extra.items()})
    return env


def check_program(argv0: str, cwd: Path, env: dict[str, str]) -> None:
    """The program must exist before it is started; a missing one is a config error."""
    if "/" in argv0:
        path = cwd / argv0
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise ConfigError(f"command.argv[0]: {argv0!r} is not an executable file (from {cwd})")
    elif shutil.which(argv0, path=env.get("PATH", os.defpath)) is None:
        raise ConfigError(f"command.argv[0]: {argv0!r} not found on PATH")


def launch(
    argv: list[str],
    *,
    cwd: Path,
    env: dict[str, str],
    record_in: Path,
    deadline: float | None = None,
) -> FencedRun:
    """Start ``argv`` inside a fence of its own (a cgroup too, where the host gives one), stdin
    closed, output piped; ``deadline``: the lease's end, the fence's from the first moment.

    A fresh token goes into the command's environment and the run is recorded in the workdir
    (``record_in``), before the start and again with its group after, so whatever outlives
    this executor and its fence can be reaped by the next (``workdir.reap_command``).
    """
    token = new_token()
    env = {**env, TOKEN_ENV: token}
    cg = fencing.new_cgroup(token)
    record_command(record_in, token, None, cg)
    try:
        run = fencing.launch(argv, cwd=cwd, env=env, workdir=record_in, cg=cg, deadline=deadline)
    except BaseException:
        if cg is not None:
            cgroup.remove(cg)
        raise
    record_command(record_in, token, run.pid, cg)  # the fence leads the command's group
    return run


def signal_group(proc: FencedRun | ForkedRun, sig: int) -> None:
    """Signal the command's whole process group (its pid is the group's id: its fence leads
    it, or, forked by the zygote, it leads a session of its own). The fence ignores SIGTERM,
    SIGINT and SIGHUP: the run's end is ``proc.fence.end()``."""
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def describe_exit(code: int | None) -> str:
    if code is None:
        return "exit status unknown"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


class LineLog:
    """Output lines as Log events, cut and rate-limited; the last stderr lines kept for a crash."""

    def __init__(self, emit: Emit) -> None:
        self._emit = emit
        self._lock = threading.Lock()
        self._tokens = float(LINE_BURST)
        self._t = time.monotonic()
        self._dropped = 0
        self.tail: deque[str] = deque(maxlen=5)

    def __call__(self, level: LogLevel, text: str) -> None:
        if len(text) > MAX_LINE_CHARS:
            text = text[:MAX_LINE_CHARS] + f"… ({len(text) - MAX_LINE_CHARS} more characters)"
        with self._lock:
            if level == "stderr" and text.strip():
                self.tail.append(text)
            now = time.monotonic()
            self._tokens = min(LINE_BURST, self._tokens + (now - self._t) * LINES_PER_S)
            self._t = now
            if self._tokens < 1:
                self._dropped += 1
                return
            self._tokens -= 1
            dropped, self._dropped = self._dropped, 0
        if dropped:
            self._dropped_line(dropped)
        self._emit(Log(level=level, text=text))

    def flush(self) -> None:
        with self._lock:
            dropped, self._dropped = self._dropped, 0
        if dropped:
            self._dropped_line(dropped)

    def _dropped_line(self, n: int) -> None:
        self._emit(
            Log(
                level=LogLevel.WARNING,
                text=f"{n} lines of command output dropped (over {LINES_PER_S:g}/s)",
            )
        )


def read_lines(stream: IO[bytes], on_line: Callable[[str], None]) -> None:
    """Call ``on_line`` for each line until EOF; a line longer than MAX_LINE_BYTES is cut."""
    skipping = False
    for raw in iter(lambda: stream.readline(MAX_LINE_BYTES), b""):
        whole = raw.endswith(b"\n")
        if not skipping:
            on_line(raw.decode("utf-8", "replace").rstrip("\r\n"))
        skipping = not whole


def start_reader(name: str, stream: IO[bytes], on_line: Callable[[str], None]) -> threading.Thread:
    t = threading.Thread(target=read_lines, args=(stream, on_line), name=name, daemon=True)
    t.start()
    return t


class Meter:
    """Steps and loss as the command reports them; Progress events at most every ``interval_s``
    (the first one at once: it ends a recovery). Nothing is counted or reported once the lease
    has ended: a console that moved on must not count a stale run's steps.

    The rate is timed over when lines *arrived*, which for a script writing to a pipe (block
    buffered) or a metrics file read in one go is in batches: many steps within microseconds.
    So steps are sampled in buckets of at least ``RATE_BUCKET_S`` (a bucket's time is when its
    first line came, its step the latest), and no rate is given (0.0: unknown) until the
    samples span ``RATE_MIN_SPAN_S``. Timing each line would report a batch of 32 lines read
    at once as ~1e6 steps/s."""

    RATE_BUCKET_S = 0.1
    RATE_MIN_SPAN_S = 1.0

    def __init__(
        self,
        steps: int,
        epoch: int,
        emit: Emit,
        interval_s: float = 0.5,
        *,
        lease_valid: LeaseCheck | None = None,
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self.steps, self.epoch, self._emit, self.interval_s = steps, epoch, emit, interval_s
        self._lease_valid = lease_valid
        self._now = now
        self._lock = threading.Lock()
        self.step = 0
        self.loss = math.nan
        self.last_advance = now()
        """When the step last changed (or a checkpoint arrived): what hang detection watches."""
        self._rate: deque[tuple[float, int]] = deque(maxlen=64)
        """(when a bucket's first line came, its latest step): 64 buckets span >= 6.4 s."""
        self._updates = 0
        self._emitted_updates = 0
        self._last_emit = -math.inf
        self._advanced = False

    @property
    def advanced(self) -> bool:
        """Has the command reported progress (or a checkpoint) since it started?"""
        return self._advanced

    def _in_lease(self) -> bool:
        return self._lease_valid is None or self._lease_valid(0.0)

    def update(self, step: int, loss: float | None) -> None:
        if not self._in_lease():
            return
        with self._lock:
            now = self._now()
            if step != self.step or not self._updates:
                self.last_advance, self._advanced = now, True
                if self._rate and now - self._rate[-1][0] < self.RATE_BUCKET_S:
                    self._rate[-1] = (self._rate[-1][0], step)
                else:
                    self._rate.append((now, step))
            self.step = step
            if loss is not None:
                self.loss = loss
            self._updates += 1

    def touch(self, *, advanced: bool = True) -> None:
        with self._lock:
            self.last_advance = self._now()
            self._advanced = self._advanced or advanced

    def maybe_emit(self, force: bool = False) -> None:
        """A Progress event if something new was parsed and it is due (``force``: due now)."""
        if not self._in_lease():
            return
        with self._lock:
            now = self._now()
            fresh = self._updates != self._emitted_updates
            first = self._emitted_updates == 0
            due = force or first or now - self._last_emit >= self.interval_s
            if not (fresh and due):
                return
            self._last_emit, self._emitted_updates = now, self._updates
            rate = 0.0
            if len(self._rate) >= 2:
                (t0, s0), (t1, s1) = self._rate[0], self._rate[-1]
                span = t1 - t0
                rate = (s1 - s0) / span if span >= self.RATE_MIN_SPAN_S and s1 > s0 else 0.0
            left = max(0, self.steps - self.step)
            msg = Progress(
                step=self.step,
                steps=self.steps,
                loss=self.loss,
                steps_per_s=rate,
                eta_s=left / rate if rate > 0 else None,
                epoch=self.epoch,
            )
        self._emit(msg)


def parse_progress(pattern: re.Pattern[str], line: str) -> tuple[int, float | None] | None:
    m = pattern.search(line)
    if m is None:
        return None
    try:
        step = int(m.group("step"))
        loss = m.groupdict().get("loss")
        return step, float(loss) if loss is not None else None
    except ValueError:
        return None


class MetricsTail:
    """New complete lines of a JSON-lines metrics file; starts at its end (old lines are history)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self._offset = path.stat().st_size
        except OSError:
            self._offset = 0
        self._partial = b""

    def records(self) -> list[tuple[int, float | None]]:
        try:
            size = self.path.stat().st_size
            if size < self._offset:  # replaced or truncated: read it from the start
                self._offset, self._partial = 0, b""
            if size == self._offset:
                return []
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read(size - self._offset)
        except OSError:
            return []
        self._offset += len(data)
        *lines, self._partial = (self._partial + data).split(b"\n")
        out = []
        for line in lines:
            try:
                rec = json.loads(line)
                step = rec["step"]
                loss = rec.get("loss")
                if isinstance(step, int) and not isinstance(step, bool):
                    out.append((step, float(loss) if isinstance(loss, int | float) else None))
            except (ValueError, KeyError, TypeError, AttributeError):
                continue
        return out
