"""The command kind's ``setup``: run before the command's first start on a host, once per what
it is, on a readied executor before Start; a failure is the run's crash, never a silent start.

A setup script here counts its runs in a file and makes the data the command needs; the
command refuses to start without that data. The evidence is those files and /proc.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import msgspec
import tomli_w
from support.commandbed import Client, children, proc_stat
from support.helpers import ExecutorProcess, run_job, wait_for

from executors import exitcodes
from executors.agent.workdir import COMMAND_GROUP
from executors.kinds.command.command_setup import DONE
from protocol import send_message
from protocol.messages import Finished, Prepare, Start
from protocol.spec import CommandSpec, JobSpec

SETUP = r"""
import os, sys, time
from pathlib import Path
count, how = Path(sys.argv[1]), sys.argv[2]
with open(count, "a") as f:
    f.write(f"{os.getpid()}\n")
print(f"setup run {len(count.read_text().split())}: {how}", flush=True)
if how == "fail":
    print("fatal: could not fetch the data", flush=True)
    sys.exit(3)
if how == "hang":
    time.sleep(600)
Path("data.txt").write_text("tokens")
"""

# Says five steps if its data is there, else fails loudly.
TRAIN = r"""
import sys
from pathlib import Path
if not Path("data.txt").exists():
    sys.exit("no data.txt: setup did not run")
for step in range(1, 6):
    print(f"step {step} loss 0.5", flush=True)
"""


def command(tmp_path: Path, how: str = "ok", **over: Any) -> dict[str, Any]:
    setup, train = tmp_path / "setup.py", tmp_path / "train.py"
    setup.write_text(SETUP)
    train.write_text(TRAIN)
    return {
        "argv": [sys.executable, str(train)],
        "setup": [sys.executable, str(setup), str(tmp_path / "count"), how],
        "progress_regex": r"step (?P<step>\d+) loss (?P<loss>[0-9.]+)",
        "preload": [],
        "cwd": "run",
        **over,
    }


def job_file(tmp_path: Path, table: dict[str, Any]) -> Path:
    path = tmp_path / "job.toml"
    job = {"name": "s", "executor": "command", "steps": 5, "command": table}
    path.write_text(tomli_w.dumps(job))
    return path


def runs(tmp_path: Path) -> list[int]:
    count = tmp_path / "count"
    return [int(x) for x in count.read_text().split()] if count.exists() else []


def test_setup_runs_once_before_the_first_start_and_again_only_when_it_changes(
    tmp_path: Path,
) -> None:
    work = tmp_path / "w"
    for _ in range(2):
        proc = run_job(job_file(tmp_path, command(tmp_path)), work, timeout=60)
        assert proc.returncode == exitcodes.OK, proc.stderr
        assert [e["step"] for e in proc.of("finished")] == [5]
    assert len(runs(tmp_path)) == 1, "the second run found it done"
    said = [e["text"] for e in proc.of("log") if str(e.get("text", "")).startswith("setup:")]
    assert said == [], "nothing said when it is skipped"

    changed = command(tmp_path, env={"DATASET": "v2"})  # its environment changed
    proc = run_job(job_file(tmp_path, changed), work, timeout=60)
    assert proc.returncode == exitcodes.OK, proc.stderr
    assert len(runs(tmp_path)) == 2
    texts = [str(e.get("text")) for e in proc.of("log")]
    assert "setup: setup run 2: ok" in texts
    assert any(t.startswith("setup: done in ") for t in texts)


def test_a_failed_setup_is_the_runs_crash_and_the_command_never_starts(tmp_path: Path) -> None:
    work = tmp_path / "w"
    proc = run_job(job_file(tmp_path, command(tmp_path, "fail")), work, timeout=60)
    assert proc.returncode == exitcodes.FAILED, proc.stderr
    [fault] = proc.of("fault")
    assert fault["fault"] == "crash" and fault["fatal"]
    assert "setup exited with code 3" in fault["message"]
    assert "fatal: could not fetch the data" in fault["message"]
    assert not (work / COMMAND_GROUP).exists(), "the command was never started"
    assert not (work / DONE).exists()


def test_a_setup_past_its_timeout_is_killed_whole(tmp_path: Path) -> None:
    work = tmp_path / "w"
    table = command(tmp_path, "hang", setup_timeout_s=1.0)
    proc = run_job(job_file(tmp_path, table), work, timeout=60)
    assert proc.returncode == exitcodes.FAILED, proc.stderr
    [fault] = proc.of("fault")
    assert "setup did not end within 1s" in fault["message"]
    [pid] = runs(tmp_path)
    wait_for(lambda: proc_stat(pid) is None, 10, "the setup process gone")


def test_a_readied_executor_runs_setup_before_start_and_the_run_skips_it(
    tmp_path: Path,
) -> None:
    table = command(tmp_path)
    spec = JobSpec(
        name="s", executor="command", steps=5, command=msgspec.convert(table, CommandSpec)
    )
    work = tmp_path / "w"
    proc = ExecutorProcess(["serve", "--workdir", str(work), "--kind", "command"])
    try:
        wait_for(
            lambda: (work / "executor.sock").exists() or proc.proc.poll() is not None, 60, "up"
        )
        c = Client(work / "executor.sock")
        send_message(c.sock, Prepare(spec=spec))
        wait_for(lambda: (work / DONE).exists(), 60, "setup done before any Start")
        assert len(runs(tmp_path)) == 1 and not (work / COMMAND_GROUP).exists()
        assert not children(proc.proc.pid), "setup ended; nothing else runs"
        t0 = time.monotonic()
        send_message(c.sock, Start(spec=spec, epoch=1, lease_s=30))
        done = c.until(lambda m: isinstance(m, Finished), 60)
        assert isinstance(done, Finished) and done.step == 5
        assert len(runs(tmp_path)) == 1, "the run found setup done"
        assert time.monotonic() - t0 < 60
        assert proc.finish(30)[0] == exitcodes.OK
    finally:
        if proc.proc.poll() is None:
            proc.proc.kill()
            proc.finish()
    assert os.path.exists(work / "run" / "data.txt")


def test_setup_must_be_an_argv() -> None:
    import pytest

    with pytest.raises(msgspec.ValidationError, match="setup"):
        msgspec.convert({"argv": ["python", "x.py"], "setup": []}, CommandSpec)
