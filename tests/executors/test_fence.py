"""The run's fence ends every process the run started, wherever it moved, on every path.

The command here starts a child that double-forks into a session of its own with a cleared
environment (no token, no job or epoch variables: nothing an environment scan finds). The
fence holds it (a child subreaper; a cgroup too where the host gives one) and ends it when the
executor is SIGKILLed, and when the executor is frozen (SIGSTOP) past its lease: only the
fence can act then. Evidence: /proc, and the fence's own report in the workdir.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path

import msgspec
import pytest
import tomli_w
from support.fencingbed import start_serving
from support.helpers import ExecutorProcess, alive, wait_for

from executors import clock
from executors.fencing import cgroup
from executors.fencing.run import launch
from protocol.messages import Heartbeat, Lease, Start
from protocol.spec import CommandSpec, JobSpec

ESCAPER = r"""
import os, sys, time
out = sys.argv[1]
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        code = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(600)"
        os.execve(sys.executable, [sys.executable, "-c", code, out + "/orphan.pid"], {})
    os._exit(0)
os.wait()
step = 0
while True:
    step += 1
    print(f"step {step} loss 0.5", flush=True)
    time.sleep(0.05)
"""


def environ(pid: int) -> list[bytes]:
    return [e for e in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0") if e]


def command(tmp_path: Path, out: Path) -> dict[str, object]:
    script = tmp_path / "escaper.py"
    script.write_text(ESCAPER)
    return {
        "argv": [sys.executable, str(script), str(out)],
        "progress_regex": r"step (?P<step>\d+) loss (?P<loss>[0-9.]+)",
        "grace_s": 0.5,
    }


def job_file(tmp_path: Path, out: Path) -> Path:
    """The escaper's job spec, for ``hotspare-executor run``."""
    job = tmp_path / "job.toml"
    spec = {"name": "esc", "executor": "command", "steps": 10**6, "command": command(tmp_path, out)}
    job.write_text(tomli_w.dumps(spec))
    return job


def orphan(out: Path) -> int | None:
    try:
        return int((out / "orphan.pid").read_text())
    except (OSError, ValueError):
        return None


def reports(work: Path) -> list[dict[str, object]]:
    path = work / "fence.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_a_double_forked_child_with_a_cleared_environment_ends_with_its_sigkilled_executor(
    tmp_path: Path,
) -> None:
    out, work = tmp_path / "out", tmp_path / "w"
    out.mkdir()
    job = job_file(tmp_path, out)
    ex = ExecutorProcess(["run", "--spec", str(job), "--workdir", str(work), "--json"])
    pid = wait_for(lambda: orphan(out), 60, "the orphan's pid file")
    assert environ(pid) == [], "nothing in its environment says whose it is"
    ex.proc.kill()
    ex.finish(30)
    wait_for(lambda: not alive(pid), 10, "the orphan's end")
    (report,) = wait_for(lambda: reports(work), 10, "the fence's report")
    assert "executor is gone" in str(report["why"])
    assert report["cgroup"] == "" or not Path(str(report["cgroup"])).exists()


def test_a_frozen_executors_run_ends_at_its_lease_end_by_the_fence_alone(tmp_path: Path) -> None:
    out, work = tmp_path / "out", tmp_path / "w"
    out.mkdir()
    ex, c = start_serving(work, "")
    try:
        spec = JobSpec(
            name="esc",
            executor="command",
            steps=10**6,
            command=msgspec.convert(command(tmp_path, out), CommandSpec),
        )
        ttl = 3.0
        c.send(Start(spec=spec, epoch=1, lease_s=ttl, lease_anchor=clock.now()))
        deadline = time.monotonic() + 60
        while (pid := orphan(out)) is None:  # renewed on every heartbeat until it runs
            assert time.monotonic() < deadline, "the orphan never wrote its pid file"
            if isinstance(c.recv(), Heartbeat):
                c.send(Lease(epoch=1, ttl_s=ttl, anchor=clock.now()))
        anchor = clock.now()
        c.send(Lease(epoch=1, ttl_s=ttl, anchor=anchor))
        end = anchor + ttl
        wait_for(lambda: reports(work) == [] and clock.now() > anchor + 0.5, 5, "the lease to land")
        ex.proc.send_signal(signal.SIGSTOP)  # the executor can fence nothing now
        wait_for(lambda: not alive(pid), ttl + 5, "the orphan's end")
        gone = clock.now()
        assert gone >= end - 0.05, f"ended {end - gone:.2f}s before its lease's end"
        assert gone <= end + 1.0, f"ended {gone - end:.2f}s after its lease's end"
        (report,) = wait_for(lambda: reports(work), 10, "the fence's report")
        assert "lease ended" in str(report["why"])
    finally:
        ex.proc.send_signal(signal.SIGCONT)
        c.close()
        ex.proc.kill()
        ex.finish(30)


def test_the_cgroup_a_run_is_in_is_its_own_and_gone_after_it(tmp_path: Path) -> None:
    if cgroup.usable() is not None:
        pytest.skip(f"no cgroup for runs here: {cgroup.usable()}")
    out, work = tmp_path / "out", tmp_path / "w"
    out.mkdir()
    job = job_file(tmp_path, out)
    ex = ExecutorProcess(["run", "--spec", str(job), "--workdir", str(work), "--json"])
    pid = wait_for(lambda: orphan(out), 60, "the orphan's pid file")
    mine = cgroup.own(pid)
    assert mine is not None and mine.name.startswith(cgroup.PREFIX)
    assert cgroup.own(ex.proc.pid) == mine.parent, "made under the executor's own cgroup"
    t0 = time.monotonic()
    ex.proc.send_signal(signal.SIGTERM)
    ex.finish(30)
    assert not alive(pid) and not mine.exists(), f"{time.monotonic() - t0:.1f}s"


@pytest.mark.parametrize("deadline", ["ended", "open"])
def test_a_fence_given_a_lease_that_has_ended_never_starts_its_command(
    tmp_path: Path, deadline: str
) -> None:
    """The fence reads the executor's first lease before it forks the command: one already
    over starts nothing (what the executor checks as well, just before; this is the last
    word). An open lease starts it as ever."""
    work, mark = tmp_path / "w", tmp_path / "ran"
    work.mkdir()
    argv = [sys.executable, "-c", "import sys; open(sys.argv[1], 'w').write('x')", str(mark)]
    until = clock.now() - 1.0 if deadline == "ended" else clock.now() + 30.0
    run = launch(argv, cwd=tmp_path, env={}, workdir=work, cg=None, deadline=until)
    code = run.wait(timeout=30)
    if deadline == "open":
        assert code == 0 and mark.exists(), "an open lease: the command ran to its end"
        return
    assert code == 137 and not mark.exists(), "the command never ran"
    (report,) = reports(work)
    assert report["why"] == "the lease ended before the command started"
    assert report["started"] is False
