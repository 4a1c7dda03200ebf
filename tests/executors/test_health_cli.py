"""``hotspare-executor health``: the light probe the console runs on a spare. One sample, no torch.

Evidence from outside the code under test: the interpreter's own ``sys.modules`` after the
command ran in it, statvfs of the folder, the fake GPU's file.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import msgspec
from support.helpers import REPO, env_with

from executors.health.gpu import FAKE_NVML_ENV
from executors.testing.gpu_fake import write_state
from protocol.messages import Health

# Runs the real entry point, then reports what that interpreter imported (stderr, last line).
_RUN_AND_REPORT = """
import sys
from executors.cli import main
code = main(sys.argv[1:])
heavy = sorted(m for m in ("torch", "numpy") if m in sys.modules)
print("imported:" + ",".join(heavy), file=sys.stderr)
sys.exit(code)
"""


def run_health(*args: str, nvml: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _RUN_AND_REPORT, "health", *args],
        cwd=REPO,
        env=env_with(**{FAKE_NVML_ENV: str(nvml)}),
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_one_sample_as_json_without_importing_torch(tmp_path: Path) -> None:
    nvml = tmp_path / "nvml.json"
    write_state(
        nvml,
        {"devices": [{"name": "Fake H100", "temp_c": 47}, {"name": "Fake H100", "lost": True}]},
    )
    workdir = tmp_path / "root"
    workdir.mkdir()
    r = run_health("--workdir", str(workdir), "--json", "--window-s", "0.05", nvml=nvml)
    assert r.returncode == 0, r.stderr
    assert r.stderr.splitlines()[-1] == "imported:", f"the probe imported {r.stderr!r}"
    (line,) = r.stdout.splitlines()
    h = msgspec.json.decode(line, type=Health)
    assert [(g.index, g.lost, g.temp_c) for g in h.gpus] == [(0, False, 47.0), (1, True, None)]
    assert h.gpu_status.startswith("ok")
    assert list(workdir.iterdir()) == [], "a probe only looks: it writes nothing"
    vfs = os.statvfs(tmp_path)
    total_mb = vfs.f_blocks * vfs.f_frsize / 2**20
    assert abs(h.disk_total_mb - total_mb) < 1, "measured where the workdir is"
    assert 0 < h.disk_free_mb <= total_mb


def test_a_plain_line_for_a_person_and_bad_input_is_one_line(tmp_path: Path) -> None:
    nvml = tmp_path / "nvml.json"
    write_state(nvml, {"devices": [{"name": "Fake H100"}, {"name": "Fake H100", "lost": True}]})
    r = run_health("--workdir", str(tmp_path), "--window-s", "0", nvml=nvml)
    assert r.returncode == 0, r.stderr
    (line,) = r.stdout.splitlines()
    assert "GiB free of" in line and line.endswith("(lost: GPU 1)"), line
    bad = run_health("--workdir", str(tmp_path), "--window-s", "-1", nvml=nvml)
    assert bad.returncode == 2
    assert bad.stdout == ""
    assert bad.stderr.splitlines()[0] == (
        "hotspare-executor: --window-s must be between 0 and 10, got -1"
    )


def test_a_workdir_that_is_not_there_is_one_line_and_exit_2(tmp_path: Path) -> None:
    """Measured on the nearest folder that exists, a typo would report another disk as this
    host's: a missing workdir (or a file) is refused, in one line, writing nothing."""
    nvml = tmp_path / "nvml.json"
    write_state(nvml, {"devices": [{"name": "Fake H100"}]})
    missing, a_file = tmp_path / "nonexistent", tmp_path / "file"
    a_file.write_text("")
    for workdir, what in ((missing, "no such folder"), (a_file, "is not a folder")):
        for json_flag in ((), ("--json",)):
            r = run_health("--workdir", str(workdir), *json_flag, "--window-s", "0", nvml=nvml)
            assert r.returncode == 2, r.stdout
            assert r.stdout == ""
            assert "Traceback" not in r.stderr
            assert r.stderr.splitlines()[:-1] == [
                f"hotspare-executor: --workdir {workdir}: {what}"
            ], "one line (the last is the test's own import report)"
    assert not missing.exists()
