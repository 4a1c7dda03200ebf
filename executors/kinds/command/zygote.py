"""The command kind's warm start: a zygote per job that has the command's modules imported.

With ``preload`` in the ``[command]`` table and an argv ``PYTHON script.py ARGS`` (or ``PYTHON
-m MODULE ARGS``), the executor keeps a zygote (executors/kinds/command/zygote_server.py): a process of that
interpreter, with the command's environment and cwd, that imported ``preload`` once and
forks each run of the command from there, one spare forked ahead and waiting, so a restart in
place skips the interpreter's start and the imports (``import torch``: most of a restart).

A forked run is the command's process as a launched one is (``command_io.launch``): its own
session and process group, stdin ``/dev/null``, stdout and stderr pipes to this executor, the
command's environment with a fresh run token (in ``/proc/PID/environ`` too) and cwd, in a
cgroup of its own that it joins before it runs a line of the command, watched by a fence
(``executors.fencing``) that kills the cgroup whole when the lease ends or the executor dies,
and recorded in the workdir before and after it starts (``workdir.record_command``), so
stops, hang kills, lease fencing and the next executor's reaping treat it alike. A host that
gives runs no cgroup gets no forked runs: a fence holds only its own descendants, and a forked
run is the zygote's. Its exit code comes from the zygote (its parent).

What differs from a fresh interpreter, on purpose: the preloaded modules were imported once,
under the environment the zygote started with (a change of that environment, the
interpreter, the cwd or the script's folder starts a new zygote); what they printed while
importing is in ``WORKDIR/zygote.log``, not the command's output; ``PYTHONHASHSEED``'s random
default is the zygote's, shared by its runs. ``random`` and numpy's global generator are
reseeded in each run, as a new process would be; a script's ``sys.argv[0]`` is its absolute
path (``__file__`` is, in a fresh Python too); ``/proc/PID/cmdline`` shows the command's argv
padded with empty strings (the room of the zygote's).

Anything the zygote cannot do (argv not a plain Python one, a preload that fails, the zygote
not ready in time) starts the command with exec as without ``preload``, with a Log line that
says why. The zygote is started from a long-lived thread of its own: ``PR_SET_PDEATHSIG``
follows the thread that forked, and a run's thread ends with the run.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import executors
from executors.agent.workdir import TOKEN_ENV, new_token, record_command
from executors.fencing import cgroup
from executors.fencing import run as fencing
from protocol.errors import HotspareError

SERVER = Path(__file__).resolve().with_name("zygote_server.py")
BUNDLE = Path(executors.__file__).resolve().parent.parent
LOG = "zygote.log"
PLACEHOLDER = "-" * len(new_token())
"""The run token in the zygote's own environment: as long as a token, never equal to one."""
MARK = f"{TOKEN_ENV}={PLACEHOLDER}"
MAX_ORDERS = 100_000
"""Bytes of one run's orders (argv, environment): a SOCK_SEQPACKET message must fit a buffer."""
STARTED_TIMEOUT_S = 10.0
PYTHON = re.compile(r"^python[0-9.]*$")

_spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hotspare-zygote")
_lock = threading.Lock()
_zygotes: dict[Path, Zygote] = {}
_failed: dict[Path, tuple[Key, str]] = {}


class ZygoteError(HotspareError):
    """The zygote cannot start this run; the command is started with exec instead."""

    permanent = True


@dataclass(frozen=True)
class Plan:
    """How the zygote runs an argv: a script's path or a module, and its arguments."""

    interpreter: str
    script: str | None
    module: str | None
    args: tuple[str, ...]
    path0: str
    """``sys.path[0]``: the script's folder, or the cwd for ``-m``."""


@dataclass(frozen=True)
class Key:
    """What a zygote was started with; a run that needs another starts a new zygote."""

    interpreter: str
    preload: tuple[str, ...]
    cwd: str
    path0: str
    env: tuple[tuple[str, str], ...]


def plan(argv: list[str], cwd: Path, env: dict[str, str]) -> Plan | str:
    """The zygote's plan for ``argv``, or why it cannot run it (a sentence)."""
    program = argv[0]
    if not PYTHON.match(Path(program).name):
        return f"argv[0] {program!r} is not a python interpreter"
    if "/" in program:
        interpreter = str(cwd / program)
    else:
        import shutil

        found = shutil.which(program, path=env.get("PATH", os.defpath))
        if found is None:
            return f"argv[0] {program!r} not found on PATH"
        interpreter = found
    if len(argv) < 2:
        return "no script or -m module after the interpreter"
    if argv[1] == "-m":
        if len(argv) < 3:
            return "-m without a module"
        return Plan(interpreter, None, argv[2], tuple(argv[3:]), str(cwd))
    if argv[1].startswith("-"):
        return f"interpreter option {argv[1]!r} before the script (only script or -m is warm)"
    script = cwd / argv[1]
    return Plan(interpreter, str(script), None, tuple(argv[2:]), str(script.parent))


def key(p: Plan, preload: list[str], cwd: Path, env: dict[str, str], per_run: set[str]) -> Key:
    """``per_run``: variables whose value changes between runs (placeholders): set in each run,
    not a reason for a new zygote."""
    fixed = tuple(sorted((k, v) for k, v in env.items() if k not in per_run and k != TOKEN_ENV))
    return Key(p.interpreter, tuple(preload), str(cwd), p.path0, fixed)


class Zygote:
    """One zygote process and its link; used from one thread at a time."""

    def __init__(self, k: Key, proc: subprocess.Popen[bytes], link: socket.socket) -> None:
        self.key, self.proc, self._link = k, proc, link
        self.spare: int | None = None
        self.error: str | None = None
        self.dead = False
        self.native_threads: int | None = None
        self.exits: dict[int, int] = {}
        self._started: list[int] = []

    @classmethod
    def start(cls, k: Key, env: dict[str, str], workdir: Path, title: list[str]) -> Zygote:
        """``env``: the command's environment for the run that starts it (``k.env`` and the
        per-run variables as that run has them)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        config = {
            "preload": list(k.preload),
            "path0": k.path0,
            "bundle": str(BUNDLE),
            "parent": os.getpid(),
            "mark": MARK,
            "title": title,
        }
        argv = [k.interpreter, "-c", SERVER.read_text(), str(theirs.fileno()), json.dumps(config)]
        env = {**env, TOKEN_ENV: PLACEHOLDER}
        with open(workdir / LOG, "wb") as log:
            proc = _spawner.submit(
                subprocess.Popen,
                argv,
                cwd=k.cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                pass_fds=[theirs.fileno()],
                start_new_session=True,
            ).result()
        theirs.close()
        return cls(k, proc, ours)

    # ------------------------------------------------------------ messages

    def pump(self, timeout: float) -> None:
        """Take what the zygote said, waiting up to ``timeout`` for the first message."""
        if self.dead:
            time.sleep(min(timeout, 0.05))
            return
        ready, _, _ = select.select([self._link], [], [], max(0.0, timeout))
        while ready:
            try:
                data = self._link.recv(1 << 16)
            except OSError:
                data = b""
            if not data:
                self.dead, self.spare = True, None
                self.error = self.error or f"the zygote ended ({self._exit_text()})"
                return
            self._take(json.loads(data))
            ready, _, _ = select.select([self._link], [], [], 0)

    def _take(self, msg: dict) -> None:
        op = msg["op"]
        if op == "ready":
            self.spare = msg["pid"]
            self.native_threads = msg.get("threads", self.native_threads)
        elif op == "failed":
            self.error = msg["error"]
        elif op == "started":
            self._started.append(msg["pid"])
            self.spare = None
        elif op == "exited":
            self.exits[msg["pid"]] = msg["code"]

    def _exit_text(self) -> str:
        try:
            code = self.proc.wait(timeout=1)
        except subprocess.TimeoutExpired:
            return "its link closed"
        return f"exit {code}"

    def wait_ready(self, deadline: float, cancelled: Callable[[], bool]) -> bool:
        """Until a spare waits (True), or a stop asks (False); ZygoteError if it cannot serve."""
        while self.spare is None:
            if self.error is not None:
                raise ZygoteError(self.error)
            if cancelled():
                return False
            left = deadline - time.monotonic()
            if left <= 0:
                raise ZygoteError("the zygote was not ready in time (its imports)")
            self.pump(min(left, 0.1))
        return True

    # ---------------------------------------------------------------- runs

    def run(
        self,
        p: Plan,
        argv: list[str],
        *,
        cwd: Path,
        env: dict[str, str],
        record_in: Path,
        deadline: float | None = None,
    ) -> ForkedRun:
        """Hand the run to the waiting spare, in a cgroup its fence watches (from before the
        fork: no moment without one); its pid and group recorded like a launched one's."""
        token = new_token()
        cg = fencing.new_cgroup(token)
        if cg is None:
            raise ZygoteError(f"a forked run needs a cgroup: {cgroup.usable() or 'none made'}")
        try:
            fence = fencing.watch(cg, workdir=record_in, deadline=deadline)
        except OSError as e:
            cgroup.remove(cg)
            raise ZygoteError(f"the run's fence did not start: {e}") from None
        try:
            return self._hand_over(p, argv, cwd, env, record_in, token, cg, fence)
        except BaseException:
            fence.end()
            raise

    def _hand_over(
        self,
        p: Plan,
        argv: list[str],
        cwd: Path,
        env: dict[str, str],
        record_in: Path,
        token: str,
        cg: Path,
        fence: fencing.FenceLink,
    ) -> ForkedRun:
        orders = {
            "op": "run",
            "mark": MARK,
            "token_entry": f"{TOKEN_ENV}={token}",
            "env": {**env, TOKEN_ENV: token},
            "cwd": str(cwd),
            "argv": argv,
            "script": p.script,
            "module": p.module,
            "args": list(p.args),
            "path0": p.path0,
            "bundle": str(BUNDLE),
            "cgroup": str(cg),
        }
        data = json.dumps(orders).encode()
        if len(data) > MAX_ORDERS:
            raise ZygoteError(f"the command's argv and environment take {len(data)} bytes")
        r_out, w_out = os.pipe()
        r_err, w_err = os.pipe()
        try:
            record_command(record_in, token, None, cg)
            socket.send_fds(self._link, [data], [w_out, w_err])
        except OSError as e:
            os.close(r_out)
            os.close(r_err)
            raise ZygoteError(f"the zygote's link: {e}") from None
        finally:
            os.close(w_out)
            os.close(w_err)
        deadline = time.monotonic() + STARTED_TIMEOUT_S
        while not self._started and self.error is None and time.monotonic() < deadline:
            self.pump(deadline - time.monotonic())
        if not self._started:
            os.close(r_out)
            os.close(r_err)
            raise ZygoteError(self.error or "the zygote did not start the run in time")
        pid = self._started.pop(0)
        record_command(record_in, token, pid, cg)  # its own session: the group's id is its pid
        run = ForkedRun(self, pid, argv, os.fdopen(r_out, "rb"), os.fdopen(r_err, "rb"))
        run.fence = fence
        return run

    def close(self) -> None:
        """End the zygote and its spare (never a run in flight: the caller's run is over)."""
        self._link.close()
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        self.proc.wait()


class ForkedRun:
    """A run the zygote forked, with what ``CommandRunner`` uses of ``subprocess.Popen``."""

    def __init__(
        self, zygote: Zygote, pid: int, argv: list[str], stdout: IO[bytes], stderr: IO[bytes]
    ) -> None:
        self.zygote, self.pid, self.args = zygote, pid, argv
        self.stdout, self.stderr = stdout, stderr
        self.returncode: int | None = None
        self.fence: fencing.FenceLink
        """The fence over the run's cgroup (set by ``Zygote.run``)."""

    def _code(self) -> int | None:
        if self.returncode is None:
            code = self.zygote.exits.pop(self.pid, None)
            if code is None and self.zygote.dead and not _alive(self.pid):
                code = -signal.SIGKILL  # the zygote died, and its children with it
            self.returncode = code
        return self.returncode

    def poll(self) -> int | None:
        if self.returncode is None:
            self.zygote.pump(0)
        return self._code()

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = 0.5 if deadline is None else deadline - time.monotonic()
            if left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
            self.zygote.pump(min(left, 0.5))
        assert self.returncode is not None
        return self.returncode


def _alive(pid: int) -> bool:
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return raw[raw.rfind(b")") + 2 :].split()[0] not in (b"Z", b"X")


# ------------------------------------------------------------------ one per job


def ensure(
    workdir: Path, k: Key, env: dict[str, str], title: list[str]
) -> tuple[Zygote | None, str | None]:
    """The workdir's zygote for ``k``, started if there is none or it was started for another
    key; (None, why) when one for ``k`` already failed. The second value: a note for the log."""
    with _lock:
        failed = _failed.get(workdir)
        if failed is not None and failed[0] == k:
            return None, failed[1]
        z = _zygotes.get(workdir)
        note = None
        if z is not None and (z.key != k or z.dead):
            note = f"a new zygote: {_difference(z.key, k) if not z.dead else 'the last one ended'}"
            z.close()
            z = None
        if z is None:
            z = _zygotes[workdir] = Zygote.start(k, env, workdir, title)
        return z, note


def failed(workdir: Path, z: Zygote, why: str) -> None:
    """``z`` cannot serve: closed, and not started again for the same key."""
    with _lock:
        _failed[workdir] = (z.key, why)
        if _zygotes.get(workdir) is z:
            del _zygotes[workdir]
    z.close()


def close(workdir: Path) -> None:
    with _lock:
        z = _zygotes.pop(workdir, None)
        _failed.pop(workdir, None)
    if z is not None:
        z.close()


def close_all() -> None:
    for w in list(_zygotes):
        close(w)


def _difference(old: Key, new: Key) -> str:
    if old.interpreter != new.interpreter:
        return f"the interpreter is {new.interpreter}, the zygote ran {old.interpreter}"
    if old.preload != new.preload:
        return "preload changed"
    if old.cwd != new.cwd or old.path0 != new.path0:
        return "the cwd or the script's folder changed"
    changed = sorted({k for k, _ in set(old.env) ^ set(new.env)})
    return f"the environment changed ({', '.join(changed[:5])})"
