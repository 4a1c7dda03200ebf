"""``hotspare-executor serve --spec BAD``: refused in one line before the workdir is touched,
so no lock or pid file is left to name an executor that never ran (the console reads a lock
file as 'an executor ran here')."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from support.helpers import REPO, env_with

from executors import exitcodes


@pytest.mark.parametrize("existing", [False, True], ids=["new workdir", "existing workdir"])
def test_serve_with_a_bad_spec_leaves_no_lock_and_no_pid(tmp_path: Path, existing: bool) -> None:
    spec = tmp_path / "job.toml"
    spec.write_text('name = "x"\nsteps = [10\n')
    workdir = tmp_path / "w"
    if existing:
        workdir.mkdir()
    serve = ["serve", "--workdir", str(workdir), "--spec", str(spec), "--idle-exit-s", "5"]
    proc = subprocess.run(
        [sys.executable, "-m", "executors.cli", *serve],
        cwd=REPO,
        env=env_with(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == exitcodes.CONFIG, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "TOML syntax error" in lines[0], proc.stderr
    assert not (workdir / "executor.lock").exists()
    assert not (workdir / "executor.pid").exists()
    assert workdir.exists() is existing, "a workdir is not made for a job refused"
