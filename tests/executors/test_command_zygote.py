"""The command kind's warm start: runs forked from a zygote with ``preload`` imported.

A forked run must be the command's process exactly as an exec'd one is: its own session and
process group, the run token in its environment, recorded in the workdir, killed on Stop
within its grace, reaped by the next executor when its own was SIGKILLed, restarted in place
after a crash (warm again) from its checkpoint. /proc is the evidence, not the executor's
word. What the zygote cannot run is exec'd, with a Log line that says why.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import tomli_w
from support.commandbed import Client, children, proc_stat
from support.helpers import (
    WORKER_TREE,
    ExecutorProcess,
    maps_torch,
    plain_command,
    run_job,
    wait_for,
    worker_tree_pids,
)

from executors import exitcodes
from executors.agent.workdir import COMMAND_GROUP, TOKEN_ENV
from protocol import send_message
from protocol.faults import StopReason
from protocol.messages import (
    Finished,
    Log,
    Prepare,
    Progress,
    Resumed,
    RunEnded,
    Start,
    Stop,
    Stopped,
)
from protocol.spec import CommandSpec, JobSpec

PROGRESS = r"step (?P<step>\d+) loss (?P<loss>[0-9.]+)"

# What a script sees of its process; then it ends as told by its first argument.
REPORT = r"""
import json, os, sys
print("report " + json.dumps({
    "argv": sys.argv, "file": __file__, "name": __name__, "cwd": os.getcwd(),
    "x": os.environ.get("X"), "path0": sys.path[0],
    "hotspare": sorted(m for m in sys.modules if m.split(".")[0] in ("executors", "protocol")),
}), flush=True)
how = sys.argv[1]
if how == "raise":
    raise ValueError("boom")
sys.exit(int(how))
"""

# Ignores SIGTERM and says a step every 50 ms: only SIGKILL ends it.
STUBBORN = r"""
import signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
step = 0
while True:
    step += 1
    print(f"step {step} loss 0.5", flush=True)
    time.sleep(0.05)
"""


def alive(pid: int) -> bool:
    st = proc_stat(pid)
    return st is not None and st["state"] not in ("Z", "X")


def cmdline(pid: int) -> list[str]:
    """Its command line; [] once it is gone (a short-lived child listed a moment before: a
    fresh-clone run read one that had ended)."""
    try:
        data = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode() for a in data.split(b"\0") if a]


def started_pid(text: str) -> int:
    return int(text.split()[3].rstrip(":"))


def job_file(tmp_path: Path, argv: list[str], **command: Any) -> Path:
    job = {
        "name": "warm",
        "executor": "command",
        "steps": 1_000_000,
        "command": {"argv": argv, "progress_regex": PROGRESS, **command},
    }
    path = tmp_path / "job.toml"
    path.write_text(tomli_w.dumps(job))
    return path


def logs(proc: ExecutorProcess, level: str | None = None) -> list[str]:
    return [e["text"] for e in proc.of("log") if level in (None, e["level"])]


@pytest.fixture
def executors_() -> Iterator[list[ExecutorProcess]]:
    procs: list[ExecutorProcess] = []
    yield procs
    for p in procs:
        if p.proc.poll() is None:
            p.proc.kill()
        p.finish()


def serve(work: Path, procs: list[ExecutorProcess]) -> tuple[ExecutorProcess, Client]:
    proc = ExecutorProcess(
        ["serve", "--workdir", str(work), "--kind", "command", "--heartbeat-s", "0.2"]
    )
    procs.append(proc)
    wait_for(
        lambda: (work / "executor.sock").exists() or proc.proc.poll() is not None, 60, "socket"
    )
    assert proc.proc.poll() is None, proc.stderr
    return proc, Client(work / "executor.sock")


def test_a_crashed_warm_run_restarts_in_place_warm_from_its_checkpoint(
    tmp_path: Path, executors_: list[ExecutorProcess]
) -> None:
    table = {**plain_command(0.02), "preload": ["torch"]}
    spec = JobSpec(
        name="plain", executor="command", steps=60, command=msgspec.convert(table, CommandSpec)
    )
    work = tmp_path / "w"
    executor, c = serve(work, executors_)
    send_message(c.sock, Start(spec=spec, epoch=1, lease_s=30))
    first = c.started()
    assert "(forked warm, preloaded torch)" in first.text
    child = started_pid(first.text)
    st = proc_stat(child)
    assert st is not None and st["pgid"] == child and st["sid"] == child, "a session of its own"
    zygote = st["ppid"]
    assert zygote != executor.proc.pid and proc_stat(zygote)["ppid"] == executor.proc.pid
    wait_for(  # ps shows the command: the fork rewrites it a moment after it is started
        lambda: Path(cmdline(child)[1]).name == "train_plain.py", 10, "the command's cmdline"
    )
    record = json.loads((work / COMMAND_GROUP).read_text())
    assert record["pgid"] == child
    token = f"{TOKEN_ENV}={record['token']}".encode()
    assert token in Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
    assert token not in Path(f"/proc/{zygote}/environ").read_bytes().split(b"\0")

    c.until(lambda m: isinstance(m, Progress) and m.step >= 25, 60)
    os.kill(child, signal.SIGKILL)
    ended = c.until(lambda m: isinstance(m, RunEnded), 30)
    assert isinstance(ended, RunEnded) and ended.fault == "crash"
    assert ended.checkpoint_step is not None and ended.checkpoint_step >= 20
    wait_for(lambda: not alive(child), 10, "the killed run reaped by the zygote")

    send_message(c.sock, Start(spec=spec, epoch=2, lease_s=30))
    resumed = c.until(lambda m: isinstance(m, Resumed), 30)
    assert isinstance(resumed, Resumed) and resumed.step == ended.checkpoint_step
    again = c.started()
    assert "(forked warm" in again.text and started_pid(again.text) != child
    assert proc_stat(started_pid(again.text))["ppid"] == zygote, "the same zygote, one fork ahead"
    said = c.until(lambda m: isinstance(m, Log) and m.text.startswith("resume "), 30)
    assert isinstance(said, Log) and said.text.endswith(f"at step {ended.checkpoint_step}")
    done = c.until(lambda m: isinstance(m, Finished), 60)
    assert isinstance(done, Finished) and done.step == 60
    rc, err = executor.finish(30)
    assert rc == exitcodes.OK, err
    wait_for(lambda: not alive(zygote), 10, "the zygote ended with its executor")


def test_a_forked_run_is_recorded_and_reaped_like_an_exec_one(tmp_path: Path) -> None:
    script = tmp_path / "workers.py"
    script.write_text(WORKER_TREE)
    work, first_out, second_out = tmp_path / "w", tmp_path / "first", tmp_path / "second"
    first_out.mkdir()
    second_out.mkdir()

    def job(out: Path) -> Path:
        argv = [sys.executable, str(script), "leader", str(out)]
        return job_file(tmp_path, argv, grace_s=0.5, preload=["subprocess"])

    def start(out: Path) -> ExecutorProcess:
        return ExecutorProcess(["run", "--spec", str(job(out)), "--workdir", str(work), "--json"])

    first = start(first_out)
    try:
        old = wait_for(lambda: worker_tree_pids(first_out), 60, "the command's three processes")
        leader = old["leader"]
        assert {proc_stat(p)["pgid"] for p in old.values()} == {leader}
        assert proc_stat(leader)["sid"] == leader
        zygote = proc_stat(leader)["ppid"]
        assert zygote != first.proc.pid, "forked by the zygote"
        record = json.loads((work / COMMAND_GROUP).read_text())
        assert record["pgid"] == leader
        token = f"{TOKEN_ENV}={record['token']}".encode()
        for pid in old.values():
            assert token in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    finally:
        first.proc.kill()  # SIGKILL, the executor only
        first.finish(30)
    wait_for(lambda: not alive(zygote), 10, "the zygote's death signal")
    wait_for(  # the run's fence kills its cgroup: the workers in their own group too
        lambda: not any(alive(p) for p in old.values()), 10, "the whole run's end"
    )
    wait_for(  # the fence removes it once the kernel counts it empty, a moment after the kill
        lambda: not record["cgroup"] or not Path(record["cgroup"]).exists(), 10, "its cgroup gone"
    )

    second = start(second_out)
    try:
        second.wait_event(
            lambda e: e["kind"] == "log" and e["text"].startswith("command started"), 60, "start"
        )
        new = wait_for(lambda: worker_tree_pids(second_out), 60, "the new command's processes")
        t0 = time.monotonic()
        second.proc.send_signal(signal.SIGTERM)
        rc, err = second.finish(60)
        assert rc == exitcodes.PREEMPTED, err
        assert time.monotonic() - t0 < 0.5 + 5, "SIGKILL after the grace"
    finally:
        if second.proc.poll() is None:
            second.proc.kill()
            second.finish()
    assert not [p for p in new.values() if alive(p)], "a normal end kills the workers too"
    assert not (work / COMMAND_GROUP).exists()


def test_a_stop_kills_a_forked_run_that_ignores_sigterm_within_its_grace(
    tmp_path: Path, executors_: list[ExecutorProcess]
) -> None:
    script = tmp_path / "stubborn.py"
    script.write_text(STUBBORN)
    table = {
        "argv": [sys.executable, str(script)],
        "progress_regex": PROGRESS,
        "grace_s": 0.5,
        "preload": ["json"],
    }
    spec = JobSpec(
        name="s", executor="command", steps=10**6, command=msgspec.convert(table, CommandSpec)
    )
    executor, c = serve(tmp_path / "w", executors_)
    send_message(c.sock, Start(spec=spec, epoch=1, lease_s=30))
    child = started_pid(c.started().text)
    c.until(lambda m: isinstance(m, Progress), 30)
    t0 = time.monotonic()
    send_message(c.sock, Stop(reason=StopReason.OPERATOR))
    stopped = c.until(lambda m: isinstance(m, Stopped), 10)
    assert isinstance(stopped, Stopped) and stopped.reason == "operator"
    assert time.monotonic() - t0 < 0.5 + 3
    assert not alive(child)
    assert executor.finish(30)[0] == exitcodes.STOPPED


@pytest.mark.parametrize(
    ("argv_head", "preload", "why"),
    [
        (["env"], ["json"], "argv[0] 'env' is not a python interpreter"),
        (
            [],
            ["no_such_module_zz"],
            "preload 'no_such_module_zz': ModuleNotFoundError: No module named 'no_such_module_zz'",
        ),
        ([], ["json"], None),
    ],
    ids=["not-python", "bad-preload", "warm"],
)
def test_what_the_zygote_cannot_run_is_execd_and_said_and_a_run_ends_like_python(
    tmp_path: Path, argv_head: list[str], preload: list[str], why: str | None
) -> None:
    script = tmp_path / "report.py"
    script.write_text(REPORT)
    argv = [*argv_head, sys.executable, str(script), "raise"]
    spec = job_file(tmp_path, argv, preload=preload, env={"X": "{step}"})
    proc = run_job(spec, tmp_path / "w", timeout=60)
    assert proc.returncode == exitcodes.FAILED, proc.stderr
    warnings = [t for t in logs(proc, "warning") if t.startswith("preload:")]
    started = next(t for t in logs(proc, "info") if t.startswith("command started"))
    if why is None:
        assert warnings == [] and "(forked warm, preloaded json)" in started
    else:
        assert warnings == [f"preload: starting the command with exec: {why}"]
        assert "forked" not in started
    report = json.loads(next(t for t in logs(proc, "stdout") if t.startswith("report "))[7:])
    assert report == {
        "argv": [str(script), "raise"],
        "file": str(script),
        "name": "__main__",
        "cwd": str((tmp_path / "w").resolve()),
        "x": "0",
        "path0": str(tmp_path),
        "hotspare": [],
    }
    [fault] = proc.of("fault")
    assert "exited with code 1" in fault["message"] and "ValueError: boom" in fault["message"]
    stderr = logs(proc, "stderr")
    assert stderr[0] == "Traceback (most recent call last):"
    assert not [t for t in stderr if "<string>" in t or "runpy" in t], stderr


def test_a_warm_run_exits_with_its_systemexit_code(tmp_path: Path) -> None:
    script = tmp_path / "report.py"
    script.write_text(REPORT)
    spec = job_file(tmp_path, [sys.executable, str(script), "3"], preload=["json"])
    proc = run_job(spec, tmp_path / "w", timeout=60)
    assert proc.returncode == exitcodes.FAILED, proc.stderr
    [fault] = proc.of("fault")
    assert "exited with code 3" in fault["message"]


@pytest.mark.parametrize("bad", ["not a module", "torch..nn", ""])
def test_preload_names_modules(bad: str) -> None:
    with pytest.raises(msgspec.ValidationError, match="preload"):
        msgspec.convert({"argv": ["python", "x.py"], "preload": [bad]}, CommandSpec)


def plain_spec() -> JobSpec:
    """PLAIN_SCRIPT for 40 steps, preload unset (the shipped default)."""
    table = msgspec.convert(plain_command(0.02), CommandSpec)
    return JobSpec(name="plain", executor="command", steps=40, command=table)


def readied_zygote(executor: int) -> int:
    """The executor's zygote once its imports are done: it has mapped torch and forked its
    spare (a child of its own), as seen in /proc."""
    zygotes: list[int] = []

    def ready() -> bool:
        zygotes[:] = [p for p in children(executor) if cmdline(p)[:1] == ["hotspare-zygote"]]
        return len(zygotes) == 1 and maps_torch(zygotes[0]) and bool(children(zygotes[0]))

    wait_for(ready, 120, "a zygote with torch imported and its spare forked")
    return zygotes[0]


def test_a_prepared_idle_executor_imports_before_start_and_forks_the_run_from_that_zygote(
    tmp_path: Path, executors_: list[ExecutorProcess]
) -> None:
    """Prepare (a failover's target while the old lease runs out): the zygote imports at the
    defaults (preload unset) while nothing runs; the Start's run is forked from it."""
    spec = plain_spec()
    work = tmp_path / "w"
    executor, c = serve(work, executors_)
    send_message(c.sock, Prepare(spec=spec))
    zygote = readied_zygote(executor.proc.pid)
    assert not (work / COMMAND_GROUP).exists(), "nothing runs before Start"
    assert not [m for m in c.seen if isinstance(m, Log) and m.text.startswith("command started")]

    send_message(c.sock, Start(spec=spec, epoch=1, lease_s=30))
    started = c.started()
    assert "(forked warm, preloaded torch, torch._dynamo)" in started.text
    assert proc_stat(started_pid(started.text))["ppid"] == zygote, "forked from the readied one"
    done = c.until(lambda m: isinstance(m, Finished), 60)
    assert isinstance(done, Finished) and done.step == 40
    assert executor.finish(30)[0] == exitcodes.OK
    wait_for(lambda: not alive(zygote), 10, "the zygote ended with its executor")


def test_a_prepared_executor_told_to_stop_leaves_no_zygote_and_ran_nothing(
    tmp_path: Path, executors_: list[ExecutorProcess]
) -> None:
    """A readied target not used (a blip ended the lease wait, another host was chosen)."""
    spec = plain_spec()
    work = tmp_path / "w"
    executor, c = serve(work, executors_)
    send_message(c.sock, Prepare(spec=spec))
    zygote = readied_zygote(executor.proc.pid)
    spare = children(zygote)
    send_message(c.sock, Stop(reason=StopReason.NOT_NEEDED, checkpoint=False))
    assert executor.finish(30)[0] == exitcodes.STOPPED
    wait_for(lambda: not any(alive(p) for p in [zygote, *spare]), 10, "zygote and spare gone")
    assert not (work / COMMAND_GROUP).exists(), "the command never ran"
