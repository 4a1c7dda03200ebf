"""The executor's side of a run's fence: start a command inside one, feed it the lease, end it.

``launch`` starts the fence (``fence.py``) in a session of its own, and the fence starts the
command in its process group: the returned ``FencedRun`` behaves as the ``subprocess.Popen``
of the command (its pid leads the group a SIGTERM goes to, ``poll`` and ``wait`` give the
command's end). ``watch`` starts a fence that only watches a cgroup, for a run the zygote
forks into it. Either way ``lease`` passes each new lease end on, and ``end`` kills the whole
run and waits until it is gone; an executor that dies unannounced closes the pipe, and the
fence ends the run by itself.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import IO

from executors.fencing import cgroup

FENCE = Path(__file__).with_name("fence.py")
REPORT = "fence.jsonl"
"""In the workdir: one line per run the fence ended, and why."""
END_TIMEOUT_S = cgroup.KILL_TIMEOUT_S + 5.0


class FenceLink:
    """The write end of a fence's pipe, and the fence."""

    def __init__(self, proc: subprocess.Popen[bytes], fd: int, cg: Path | None) -> None:
        self.proc, self.cgroup = proc, cg
        self._fd: int | None = fd
        self._sent: float | None = None
        os.set_blocking(fd, False)

    @property
    def contained_by(self) -> str:
        """``cgroup`` or ``fence``: what holds every process of the run."""
        return "cgroup" if self.cgroup is not None else "fence"

    def _send(self, line: str) -> bool:
        fd = self._fd
        if fd is None:
            return False
        try:
            os.write(fd, line.encode())
            return True
        except (BlockingIOError, BrokenPipeError, OSError):
            return False

    def lease(self, deadline: float | None) -> None:
        """The lease now ends at ``deadline`` (the executor's clock; None: no lease)."""
        if deadline == self._sent and deadline is not None:
            return
        if self._send(f"lease {'none' if deadline is None else repr(deadline)}\n"):
            self._sent = deadline

    def end(self, timeout_s: float = END_TIMEOUT_S) -> None:
        """Kill every process of the run and wait for the fence; a fence that does not answer
        is killed with its group, and the cgroup with it."""
        self._send("kill\n")
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        if self.cgroup is not None:
            cgroup.kill_and_wait(self.cgroup)

    def close(self) -> None:
        """Let go of the pipe (the fence ends the run: what an executor's death does)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


def _start(
    args: list[str],
    *,
    cwd: Path,
    env: dict[str, str] | None,
    workdir: Path,
    cg: Path | None,
    output: bool,
    deadline: float | None,
) -> tuple[subprocess.Popen[bytes], FenceLink]:
    read, write = os.pipe()
    try:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-I",
                "-S",
                str(FENCE),
                "--cgroup",
                str(cg or ""),
                "--report",
                str(workdir / REPORT),
                *args,
            ],
            cwd=cwd,
            env=env,
            stdin=read,
            stdout=subprocess.PIPE if output else subprocess.DEVNULL,
            stderr=subprocess.PIPE if output else subprocess.DEVNULL,
            start_new_session=True,
            close_fds=True,
        )
    except BaseException:
        os.close(write)
        raise
    finally:
        os.close(read)
    link = FenceLink(proc, write, cg)
    link.lease(deadline)
    return proc, link


def new_cgroup(token: str) -> Path | None:
    """A cgroup for the run named by ``token``, under this executor's; None where the host has
    none to give (the fence alone contains the run)."""
    return cgroup.make(cgroup.PREFIX + token)


class FencedRun:
    """A command started inside its fence, with what ``CommandRunner`` uses of ``Popen``."""

    def __init__(self, proc: subprocess.Popen[bytes], fence: FenceLink, argv: list[str]) -> None:
        self._proc, self.fence, self.args = proc, fence, argv
        self.pid = proc.pid
        """The fence's pid: the process group the command runs in (a SIGTERM to it reaches the
        command; the fence ignores it)."""
        assert proc.stdout is not None and proc.stderr is not None
        self.stdout: IO[bytes] = proc.stdout
        self.stderr: IO[bytes] = proc.stderr

    @property
    def returncode(self) -> int | None:
        return self._proc.returncode

    def poll(self) -> int | None:
        return self._proc.poll()

    def wait(self, timeout: float | None = None) -> int:
        return self._proc.wait(timeout)


def launch(
    argv: list[str],
    *,
    cwd: Path,
    env: dict[str, str],
    workdir: Path,
    cg: Path | None,
    deadline: float | None,
) -> FencedRun:
    """``argv`` started inside a fence (and ``cg``, when given), stdin closed, output piped."""
    proc, link = _start(
        ["--", *argv], cwd=cwd, env=env, workdir=workdir, cg=cg, output=True, deadline=deadline
    )
    return FencedRun(proc, link, argv)


def watch(cg: Path, *, workdir: Path, deadline: float | None) -> FenceLink:
    """A fence over ``cg`` alone, for a run that joins it (forked by the zygote)."""
    _proc, link = _start(
        ["--watch"], cwd=workdir, env=None, workdir=workdir, cg=cg, output=False, deadline=deadline
    )
    return link
