"""``hotspare-executor serve --spec BAD``: refused in one line before the workdir is touched,
so no lock or pid file is left to name an executor that never ran (the console reads a lock
file as 'an executor ran here'). A workdir too deep for its socket: refused in one line, and
said in its events, where a console that finds the executor gone reads why."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from support.helpers import REPO, env_with

from console.supervise.outcome import Exit, from_events_tail
from executors import exitcodes


def refused_in_one_line(said: str, *args: str) -> None:
    """``hotspare-executor serve ARGS`` exits 2 (config) with one line on stderr saying ``said``."""
    proc = subprocess.run(
        [sys.executable, "-m", "executors.cli", "serve", *args],
        cwd=REPO,
        env=env_with(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == exitcodes.CONFIG, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and said in lines[0], proc.stderr


@pytest.mark.parametrize("existing", [False, True], ids=["new workdir", "existing workdir"])
def test_serve_with_a_bad_spec_leaves_no_lock_and_no_pid(tmp_path: Path, existing: bool) -> None:
    spec = tmp_path / "job.toml"
    spec.write_text('name = "x"\nsteps = [10\n')
    workdir = tmp_path / "w"
    if existing:
        workdir.mkdir()
    refused_in_one_line(
        "TOML syntax error", "--workdir", str(workdir), "--spec", str(spec), "--idle-exit-s", "5"
    )
    assert not (workdir / "executor.lock").exists()
    assert not (workdir / "executor.pid").exists()
    assert workdir.exists() is existing, "a workdir is not made for a job refused"


def test_a_workdir_too_deep_for_its_socket_is_a_config_error_the_console_reads(
    tmp_path: Path,
) -> None:
    workdir = tmp_path / ("d" * 60) / ("e" * 60) / "jobs" / "j"
    workdir.mkdir(parents=True)
    refused_in_one_line("more than a Unix socket", "--workdir", str(workdir))
    assert not (workdir / "executor.pid").exists()
    outcome = from_events_tail((workdir / "events.jsonl").read_text())
    assert outcome.exit is Exit.CONFIG, outcome
    assert "more than a Unix socket" in outcome.why, "not 'died without a word'"
