"""One run id per job, whatever happens to it: a ``command`` job whose script writes down, at
each start, what hotspare told it of its run (environment and placeholders) is restarted in
place (its command killed), fails over (its host killed), and is started again by a second
console on the same state dir. The script's own file is the evidence: one run id, rising
epochs, and each resumed-from step the step of the checkpoint it restored."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
from support.fleetbed import local_host, run_until, until, write_inventory

from console.controller import Controller
from console.inventory import load
from console.states import JobState
from console.supervise.policy import Policy
from executors.agent.workdir import read_command

SCRIPT = r"""
import argparse, json, os, sys, time
from pathlib import Path

p = argparse.ArgumentParser()
for flag in ("--out", "--ckpt", "--workdir", "--placeholders", "--resume"):
    p.add_argument(flag)
p.add_argument("--steps", type=int)
a = p.parse_args()
loaded = int(Path(a.resume).read_text()) if a.resume else 0
names = ("HOTSPARE_RUN_ID", "HOTSPARE_JOB", "HOTSPARE_EPOCH", "HOTSPARE_RESUMED_FROM_STEP")
line = {
    "env": {k: os.environ.get(k) for k in (*names, "RUN_DIR")},
    "placeholders": a.placeholders.split(),
    "loaded": loaded,
    "workdir": a.workdir,
}
with open(a.out, "a") as f:
    f.write(json.dumps(line) + "\n")
    f.flush()
    os.fsync(f.fileno())
for step in range(loaded + 1, a.steps + 1):
    time.sleep(0.02)
    print(f"step {step} loss 1.0", flush=True)
    if step % 10 == 0:
        (Path(a.ckpt) / f"ckpt-{step}.pt").write_text(str(step))
        (Path(a.ckpt) / f"ckpt-{step}.pt.done").write_text("")
"""
STEPS = 400


def command_job(script: Path, out: Path) -> dict[str, Any]:
    argv = [sys.executable, str(script), "--out", str(out), "--ckpt", "{checkpoint_dir}"]
    argv += ["--workdir", "{workdir}", "--steps", "{steps}"]
    argv += ["--placeholders", "{run_id} {job} {epoch} {step}", "--resume", "{resume_from}"]
    return {
        "host": "a",
        "spares": ["b"],
        "executor": "command",
        "steps": STEPS,
        "keep_checkpoints": 100,
        "command": {
            "argv": argv,
            "preload": [],  # the script imports no torch: no zygote importing it
            "env": {"RUN_DIR": "runs/{run_id}"},
            "checkpoint_glob": "ckpt-*.pt",
            "complete_marker": "{name}.done",
            "progress_regex": r"step (?P<step>\d+) loss (?P<loss>[0-9.]+)",
        },
    }


def starts(out: Path) -> list[dict[str, Any]]:
    """The script's lines, one per start (complete lines only)."""
    try:
        text = out.read_text()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines(keepends=True) if line.endswith("\n")]


def manifest_steps(workdir: Path) -> set[int]:
    """The steps of the verified checkpoints the executor keeps in ``workdir``."""
    return {
        int(m.stem.removeprefix("step-")) for m in (workdir / "checkpoints").glob("step-*.json")
    }


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


async def test_a_job_keeps_one_run_id_across_restarts_failovers_and_consoles(
    tmp_path: Path,
) -> None:
    script, out = tmp_path / "train.py", tmp_path / "starts.jsonl"
    script.write_text(SCRIPT)
    inv = write_inventory(
        tmp_path / "inventory.toml",
        hosts={"a": local_host(tmp_path / "a"), "b": local_host(tmp_path / "b", role="spare")},
        jobs={"p": command_job(script, out)},
    )
    a_work, b_work = tmp_path / "a" / "jobs" / "p", tmp_path / "b" / "jobs" / "p"
    ctl = Controller(load(inv), Policy.AUTO)
    sup = ctl.jobs["p"]

    task = await run_until(
        ctl, lambda: len(starts(out)) == 1 and manifest_steps(a_work), 60, "a checkpoint on a"
    )
    recorded = read_command(a_work)
    assert recorded is not None and recorded[0] is not None
    os.kill(recorded[0], signal.SIGKILL)  # the command dies; its executor restarts it in place
    await until(lambda: len(starts(out)) == 2 or task.done(), 30, "the restart in place")
    second = starts(out)[1]["loaded"]
    replica = ctl.replicator.replica
    await until(
        lambda: (
            (replica("p", "b").manifest and replica("p", "b").manifest.step > second) or task.done()
        ),
        30,
        "a replica on b newer than the restart's checkpoint",
    )
    ctl.kill_host("a")  # SIGKILL to the executor by its recorded pid, and a unreachable
    await until(lambda: len(starts(out)) == 3 or task.done(), 30, "the failover to b")
    assert not task.done() and sup.host == "b"

    task.cancel()  # the console goes; b's executor stops when its lease ends
    await asyncio.gather(task, return_exceptions=True)
    await ctl.close()
    pid = int((b_work / "executor.pid").read_text())
    await until(lambda: not alive(pid), 30, "b's executor to end with its lease")
    again = Controller(load(inv), Policy.AUTO)
    await asyncio.wait_for(again.run(), 60)
    await again.close()
    assert again.jobs["p"].state is JobState.FINISHED

    lines = starts(out)
    assert len(lines) == 4, lines
    run_id = json.loads((tmp_path / "state" / "state.json").read_bytes())["jobs"]["p"]["run_id"]
    assert re.fullmatch(r"[0-9a-f]{32}", run_id)
    epochs = []
    for i, line in enumerate(lines):
        env = line["env"]
        epochs.append(int(env["HOTSPARE_EPOCH"]))
        assert (env["HOTSPARE_RUN_ID"], env["HOTSPARE_JOB"]) == (run_id, "p"), line
        assert env["RUN_DIR"] == f"runs/{run_id}", "the placeholder in an env value"
        resumed = int(env["HOTSPARE_RESUMED_FROM_STEP"])
        assert line["placeholders"] == [run_id, "p", env["HOTSPARE_EPOCH"], str(resumed)]
        assert resumed == line["loaded"], "the step of the checkpoint the script was given"
        if i == 0:
            assert resumed == 0 and epochs == [1], "a fresh start"
        else:
            assert resumed > 0, line
            assert resumed in manifest_steps(Path(line["workdir"])), line
    assert epochs == sorted(set(epochs)), f"epochs rise at every start: {epochs}"
    hosts = [Path(line["workdir"]) for line in lines[:3]]
    assert hosts == [a_work.resolve(), a_work.resolve(), b_work.resolve()]
    assert lines[2]["loaded"] > lines[1]["loaded"], "b resumed from the newer replica"
    for work in (a_work, b_work):  # every checkpoint's lineage names the run
        manifests = list((work / "checkpoints").glob("step-*.json"))
        assert manifests, work
        for m in manifests:
            assert json.loads(m.read_bytes())["lineage"]["run_id"] == run_id, m


@pytest.mark.long  # the suite gives every start of a job its run id (in this file); each member starts through the same JobLease.start
async def test_every_member_of_a_group_job_gets_the_same_run_id(tmp_path: Path) -> None:
    script, out = tmp_path / "train.py", tmp_path / "starts.jsonl"
    script.write_text(SCRIPT)
    job = command_job(script, out)
    job.pop("host")
    argv = job["command"]["argv"]
    argv[argv.index("--placeholders") + 1] = "{run_id} {node_rank}"
    inv = write_inventory(
        tmp_path / "inventory.toml",
        hosts={"a": local_host(tmp_path / "a"), "b": local_host(tmp_path / "b")},
        jobs={"g": {**job, "hosts": ["a", "b"], "spares": [], "steps": 30}},
    )
    ctl = Controller(load(inv), Policy.AUTO)
    await asyncio.wait_for(ctl.run(), 60)
    await ctl.close()
    assert ctl.jobs["g"].state is JobState.FINISHED
    run_id = json.loads((tmp_path / "state" / "state.json").read_bytes())["jobs"]["g"]["run_id"]
    lines = starts(out)
    assert sorted(line["placeholders"][1] for line in lines) == ["0", "1"], lines
    for line in lines:
        assert line["env"]["HOTSPARE_RUN_ID"] == line["placeholders"][0] == run_id, line
        assert (line["env"]["HOTSPARE_JOB"], line["env"]["HOTSPARE_EPOCH"]) == ("g", "1"), line
