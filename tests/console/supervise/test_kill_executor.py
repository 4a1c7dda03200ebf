"""Kill the right executor by its recorded pid: the one that holds the workdir's lock.

``pkill -f "--workdir ROOT/jobs/demo"`` also killed job ``demo2``'s executor (a prefix), missed
when ROOT had regex characters, and its failure went unseen. These run real executors (and a
real lock holder) under the local transport; /proc is the evidence of who lives.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import tomli_w
from support.helpers import REPO, WORKER_TREE, ExecutorProcess, env_with, wait_for, worker_tree_pids

from console.reach.deploy import job_dir
from console.reach.remote import KillStatus, executor_alive, kill_executor
from console.reach.transport.local import LocalTransport
from console.records.journal import Kind
from console.supervise.probe import Probe

WORKERS = WORKER_TREE

HOLDER = r"""
import signal, sys
from pathlib import Path
from executors.agent.workdir import acquire
acquire(Path(sys.argv[1]))
print("held", flush=True)
signal.pause()
"""

# An executor ending: its pid file removed, it holds the lock until told (a line on stdin).
ENDING = r"""
import os, sys
from pathlib import Path
from executors.agent.workdir import acquire
acquire(Path(sys.argv[1]))
os.unlink(Path(sys.argv[1]) / "executor.pid")
print("held", flush=True)
sys.stdin.readline()
"""


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[2])


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[Any]]]:
    """Processes a test starts; killed at its end, whatever happened."""
    started: list[subprocess.Popen[Any]] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
        p.wait()


def sleeper(procs: list[subprocess.Popen[Any]]) -> subprocess.Popen[Any]:
    p = subprocess.Popen(
        [sys.executable, "-c", "import signal; signal.pause()"], start_new_session=True
    )
    procs.append(p)
    return p


def hold_lock(work: Path, procs: list[subprocess.Popen[Any]]) -> subprocess.Popen[Any]:
    """A process that holds ``work``'s lock exactly as an executor does (``acquire``)."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(work)],
        stdout=subprocess.PIPE,
        text=True,
        env=env_with(),
        cwd=REPO,
    )
    procs.append(holder)
    assert holder.stdout is not None and holder.stdout.readline() == "held\n"
    return holder


def command_job(tmp_path: Path, out: Path) -> Path:
    script = tmp_path / "workers.py"
    script.write_text(WORKERS)
    spec = {
        "name": "demo",
        "executor": "command",
        "steps": 1_000_000,
        "command": {
            "argv": [sys.executable, str(script), "leader", str(out)],
            "preload": [],  # the script imports no torch: no zygote importing it
            "progress_regex": r"step (?P<step>\d+) loss (?P<loss>[0-9.]+)",
        },
    }
    path = tmp_path / "demo.toml"
    path.write_text(tomli_w.dumps(spec))
    return path


async def test_killing_demo_spares_demo2_under_a_root_with_regex_characters(
    tmp_path: Path, procs: list[subprocess.Popen[Any]]
) -> None:
    root = tmp_path / "r.o+t[1]"
    demo, demo2 = Path(job_dir(str(root), "demo")), Path(job_dir(str(root), "demo2"))
    out = tmp_path / "out"
    out.mkdir()
    first = ExecutorProcess(
        ["run", "--spec", str(command_job(tmp_path, out)), "--workdir", str(demo), "--json"]
    )
    second = ExecutorProcess(["serve", "--workdir", str(demo2)])
    procs += [first.proc, second.proc]
    workers = wait_for(lambda: worker_tree_pids(out), 60, "demo's command and its workers")
    wait_for(lambda: (demo2 / "executor.sock").exists(), 60, "demo2's executor")
    t = LocalTransport("h")
    python = sys.executable
    assert await executor_alive(t, python, str(demo2))
    fence = parent(workers["leader"])
    assert fence not in (first.proc.pid, 1), "the command runs under its fence"

    result = await kill_executor(t, python, str(demo), timeout=10)

    assert result.status is KillStatus.KILLED, result
    assert (result.pid, result.holders) == (first.proc.pid, [first.proc.pid])
    assert not alive(first.proc.pid)
    assert not [r for r, pid in workers.items() if alive(pid)], "the command group is reaped"
    # The fence and the kill race to end the run; either may SIGKILL the rest, and the kill may
    # SIGKILL the fence before it writes its line (CI saw reaped == 1 and no line). What must
    # hold whoever won: the fence is gone too, and if the kill reaped nothing the fence did it.
    wait_for(lambda: not alive(fence), 10, "the run's fence to be gone")
    if result.reaped == 0:
        fence_log = demo / "fence.jsonl"
        wait_for(
            lambda: fence_log.exists() and "executor is gone" in fence_log.read_text(),
            10,
            "its fence ended the run (the kill reaped nothing)",
        )
    assert not (demo / "command.pgid").exists()
    assert alive(second.proc.pid), "demo2's executor lives"
    assert await executor_alive(t, python, str(demo2))
    assert first.proc.wait(10) == -9

    again = await kill_executor(t, python, str(demo), timeout=10)
    assert again.status is KillStatus.NOT_HELD, again
    assert alive(second.proc.pid)


async def test_a_pid_file_naming_another_process_is_refused(
    tmp_path: Path, procs: list[subprocess.Popen[Any]]
) -> None:
    work = Path(job_dir(str(tmp_path / "root"), "demo"))
    holder = hold_lock(work, procs)
    assert (work / "executor.pid").read_text().strip() == str(holder.pid)
    other = sleeper(procs)
    t, python = LocalTransport("h"), sys.executable

    (work / "executor.pid").write_text(f"{other.pid}\n")
    refused = await kill_executor(t, python, str(work), timeout=5)
    assert refused.status is KillStatus.REFUSED, refused
    assert (refused.pid, refused.holders) == (other.pid, [holder.pid])
    assert alive(other.pid) and alive(holder.pid)

    gone = sleeper(procs)
    gone.kill()
    gone.wait()
    (work / "executor.pid").write_text(f"{gone.pid}\n")
    assert (await kill_executor(t, python, str(work), timeout=5)).status is KillStatus.REFUSED
    assert alive(holder.pid) and alive(other.pid)

    (work / "executor.pid").write_text("not a pid\n")
    assert (await kill_executor(t, python, str(work), timeout=5)).status is KillStatus.REFUSED
    assert alive(holder.pid)

    (work / "executor.pid").write_text(f"{holder.pid}\n")
    killed = await kill_executor(t, python, str(work), timeout=5)
    assert killed.status is KillStatus.KILLED, killed
    assert holder.wait(5) == -9
    assert alive(other.pid)


class Journal:
    def __init__(self) -> None:
        self.events: list[tuple[Kind, str, dict[str, Any]]] = []

    def record(self, kind: Kind, msg: str, **kw: Any) -> None:
        self.events.append((kind, msg, kw.get("data", {})))


async def test_the_console_journals_a_kill_and_alerts_when_it_did_not_happen(
    tmp_path: Path, procs: list[subprocess.Popen[Any]]
) -> None:
    """The console's kill, given just what it needs: a refused kill is an alert."""
    work = Path(job_dir(str(tmp_path / "root"), "demo"))
    work.mkdir(parents=True)
    holder = hold_lock(work, procs)
    alerts: list[str] = []
    journal = Journal()
    probe = Probe(
        "demo",
        inv=SimpleNamespace(python=lambda host: sys.executable),  # type: ignore[arg-type]
        transport=LocalTransport,
        journal=journal,  # type: ignore[arg-type]
        alert=lambda msg, **kw: alerts.append(msg),
    )

    other = sleeper(procs)
    (work / "executor.pid").write_text(f"{other.pid}\n")
    await probe.kill("h", str(work))
    assert alive(holder.pid) and alive(other.pid)
    assert len(alerts) == 1 and "was not killed cleanly" in alerts[0], alerts
    assert f"pid {other.pid} of executor.pid does not hold the lock" in alerts[0]
    kind, _, data = journal.events[-1]
    assert (kind, data["kill"], data["holders"]) == (Kind.EXECUTOR, "refused", [holder.pid])

    (work / "executor.pid").write_text(f"{holder.pid}\n")
    await probe.kill("h", str(work))
    assert holder.wait(10) == -9
    assert len(alerts) == 1, "a kill that happened is no alert"
    kind, msg, data = journal.events[-1]
    assert (kind, data["kill"], data["pid"]) == (Kind.EXECUTOR, "killed", holder.pid)
    assert f"killed pid {holder.pid}" in msg
    assert json.dumps(data)  # journal data stays JSON


def kill_running(work: Path) -> bool:
    """Is a kill program (``console/reach/host/kill.py``) for ``work`` running? (/proc)"""
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            args = cmdline.read_bytes().split(b"\0")
            if str(work).encode() in args and any(b"ENDING_S" in a for a in args):
                return True
    return False


async def test_an_executor_ending_after_removing_its_pid_file_is_not_held_not_refused(
    tmp_path: Path, procs: list[subprocess.Popen[Any]]
) -> None:
    """Every drain raced this: the executor had stopped and removed executor.pid, its process
    still held the lock, and the reap said 'not reaped cleanly' (an alert) although it was
    ending. The kill now gives the lock a moment to be let go of."""
    work = Path(job_dir(str(tmp_path / "root"), "demo"))
    work.mkdir(parents=True)
    ending = subprocess.Popen(  # noqa: ASYNC220 - a test's helper process
        [sys.executable, "-c", ENDING, str(work)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env_with(),
        cwd=REPO,
    )
    procs.append(ending)
    assert ending.stdout is not None and ending.stdout.readline() == "held\n"
    assert not (work / "executor.pid").exists()
    t, python = LocalTransport("h"), sys.executable
    kill = asyncio.create_task(kill_executor(t, python, str(work), timeout=10))
    deadline = time.monotonic() + 10
    while not kill_running(work):
        assert not kill.done(), kill.result()
        assert time.monotonic() < deadline, "no kill program seen in /proc"
        await asyncio.sleep(0.005)
    # the executor takes a second more to end (a slow exit): the kill looks at the lock while
    # it is still held, and must wait for it rather than refuse
    await asyncio.sleep(1.0)
    assert not kill.done(), kill.result()
    assert ending.stdin is not None
    ending.stdin.write("go\n")
    ending.stdin.flush()
    result = await kill
    assert result.status is KillStatus.NOT_HELD, result
    assert ending.wait(10) == 0, "it ended by itself: nothing killed it"

    held = hold_lock(work, procs)  # one that stays: refused once the moment has passed
    (work / "executor.pid").unlink()
    refused = await kill_executor(t, python, str(work), timeout=10)
    assert refused.status is KillStatus.REFUSED, refused
    assert alive(held.pid)
