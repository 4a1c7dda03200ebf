"""A run that finishes with no checkpoint ever taken is not a clean finish (issue 28: no
silent zero). A script whose checkpoints the job's layout does not match trains to the end
unprotected; ``hotspare run`` must say so in its exit (4, one line per job), the journal
must carry an alert and the warnings in the finished event, the report must say "not clean"
in text and JSON, and a console started again must keep the job finished (its params digest
is empty) and say the same."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from support.fleetbed import STDLIB_SCRIPT, local_host, write_inventory
from support.helpers import REPO, env_with


def hotspare(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "console.cli", *args],
        capture_output=True,
        text=True,
        env=env_with(),
        cwd=REPO,
        timeout=240,
    )


def unprotected_job(tmp_path: Path) -> Path:
    """The script saves ``ckpt-N.json``; the job looks for ``model-*.safetensors``."""
    argv = [sys.executable, str(STDLIB_SCRIPT), "--checkpoint-dir", "{checkpoint_dir}"]
    command = {
        "argv": [*argv, "--steps", "{steps}"],
        "preload": [],  # a script with no torch: no zygote importing it
        "checkpoint_glob": "model-*.safetensors",
        "progress_regex": r"step (?P<step>\d+) loss (?P<loss>[0-9.]+)",
    }
    return write_inventory(
        tmp_path / "inventory.toml",
        hosts={"a": local_host(tmp_path / "a"), "b": local_host(tmp_path / "b", role="spare")},
        jobs={
            "j": {
                "host": "a",
                "spares": ["b"],
                "executor": "command",
                "steps": 30,
                "command": command,
            }
        },
    )


def test_a_finish_with_no_checkpoint_exits_4_alerts_and_the_report_says_not_clean(
    tmp_path: Path,
) -> None:
    inv = unprotected_job(tmp_path)

    run = hotspare("--inventory", str(inv), "run", "--policy", "auto", "--json")

    assert run.returncode == 4, (run.returncode, run.stderr[-2000:])
    (line,) = [x for x in run.stderr.splitlines() if x.startswith("hotspare: job j")]
    assert line.startswith("hotspare: job j finished, not clean: "), line
    assert "no checkpoint of it was ever taken" in line and "model-*.safetensors" in line
    events = [json.loads(x) for x in run.stdout.splitlines()]
    (finished,) = [e for e in events if e["kind"] == "finished"]
    assert finished["data"]["step"] == 30, "it trained to the end"
    assert finished["data"]["params_sha256"] == ""
    assert any("never taken" in w or "ever taken" in w for w in finished["data"]["warnings"])
    assert "not clean" in finished["msg"]
    alerts = [e for e in events if e["kind"] == "alert" and "finished, not clean" in e["msg"]]
    assert alerts, [e["msg"] for e in events if e["kind"] == "alert"]
    # independent evidence that the script did write checkpoints, just not where looked
    written = sorted(p.name for p in tmp_path.glob("a/jobs/j/**/ckpt-*.json"))
    assert written, "the script saved its own checkpoints (the layout missed them)"

    report = hotspare("--inventory", str(inv), "report")
    assert report.returncode == 0, report.stderr
    (row,) = [x for x in report.stdout.splitlines() if x.startswith("| j | `")]
    assert "| not clean: the command finished and no checkpoint" in row, row
    as_json = json.loads(hotspare("--inventory", str(inv), "report", "--json").stdout)
    assert as_json["finished"] == {"j": ""}
    assert "ever taken" in as_json["not_clean"]["j"][0]

    again = hotspare("--inventory", str(inv), "run", "--policy", "auto", "--json")
    assert again.returncode == 4, (again.returncode, again.stderr[-2000:])
    assert "hotspare: job j finished, not clean: " in again.stderr
    assert not [
        e
        for e in map(json.loads, again.stdout.splitlines())
        if "started" in e["msg"] and e["kind"] == "executor"
    ], "a finished job is not run again"


def test_a_clean_finish_exits_0_and_the_report_says_clean(tmp_path: Path) -> None:
    inv = unprotected_job(tmp_path)
    text = inv.read_text().replace("model-*.safetensors", "ckpt-*.json")
    inv.write_text(text)
    run = hotspare("--inventory", str(inv), "run", "--policy", "auto")
    assert run.returncode == 0, run.stderr[-2000:]
    assert "not clean" not in run.stderr + run.stdout
    report = hotspare("--inventory", str(inv), "report")
    (row,) = [x for x in report.stdout.splitlines() if x.startswith("| j | `")]
    assert row.endswith("| yes |"), row
