"""benchmarks/restart_vs_torchrun.py reads a restart from the script's own lines: the kill, the
restarted process's first step, and the steps lost between the two."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from support.helpers import REPO, wait_for

sys.path.insert(0, str(REPO / "benchmarks"))

import restart_vs_torchrun as rvt


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(f"{ln}\n" for ln in lines))
    return path


def test_a_restart_is_read_from_the_new_process_lines_after_the_kill(tmp_path: Path) -> None:
    log = write(
        tmp_path / "steps.log",
        [
            "proc t0=99.0 pid=10 t=100.0",
            "loaded step=0 pid=10 t=101.0",
            "step 40 loss=0.1 pid=10 t=102.0",
            "saved 40 pid=10 t=102.1",
            "step 51 loss=0.1 pid=10 t=103.0",
            "proc t0=104.0 pid=11 t=104.5",
            "loaded step=40 pid=11 t=106.0",
            "step 41 loss=0.1 pid=11 t=106.25",
        ],
    )
    with open(log, "a") as f:
        f.write("step 42 loss=0.1 pid=11 t=106.5")  # still being written: no newline yet
    lines = rvt.read_log(log)
    assert rvt.last_step(lines) == 51
    assert rvt.last_step(lines, pid=11) == 41
    trial = rvt.after_kill(lines, kill_t=103.5, killed_pid=10)
    assert trial is not None
    assert (trial.killed_step, trial.resumed_step, trial.lost) == (51, 40, 11)
    assert trial.restarted_pid == 11
    assert trial.started_t == 104.0
    assert trial.seconds == 106.25 - 103.5


def test_no_restart_until_the_new_process_completed_a_step(tmp_path: Path) -> None:
    log = write(
        tmp_path / "steps.log",
        ["step 50 loss=0.1 pid=10 t=103.0", "loaded step=40 pid=11 t=106.0"],
    )
    assert rvt.after_kill(rvt.read_log(log), kill_t=103.5, killed_pid=10) is None
    assert rvt.read_log(tmp_path / "absent.log") == []


def test_the_script_process_is_found_by_its_log_path_and_its_start_time_read(
    tmp_path: Path,
) -> None:
    log = tmp_path / "steps.log"
    # argv shaped like the script's (interpreter, script, ..., the log), but a process that sleeps
    code = "import time; time.sleep(30)"
    fake = subprocess.Popen([sys.executable, "-c", code, "restart_plain.py", str(log)])
    real = tmp_path / "restart_plain.py"
    real.write_text(code)
    before = time.time()
    proc = subprocess.Popen([sys.executable, str(real), "--step-log", str(log)])
    after = time.time()
    try:
        # /proc/PID/cmdline is empty for a moment after exec
        for p in (fake, proc):
            wait_for(lambda p=p: Path(f"/proc/{p.pid}/cmdline").read_bytes(), 10, "argv")
        assert rvt.script_processes(log) == {proc.pid}, "only the process running the script"
        started = rvt.started_at(proc.pid)
        assert started is not None
        assert before - 1 <= started <= after + 1
    finally:
        for p in (fake, proc):
            p.kill()
            p.wait()
