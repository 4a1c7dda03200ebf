"""Kill all of the command, even when its executor was SIGKILLed.

A command's workers (a child and a grandchild that ignore SIGTERM, like torchrun's or a
DataLoader's) do not die with the executor by themselves: PR_SET_PDEATHSIG reaches only the
command's leader. The run's fence ends them the moment the executor is gone; where the fence
was killed too, the next executor on the workdir reaps them from the record (``command.pgid``,
the run's cgroup) before it starts anything, and only them: /proc is the evidence.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import tomli_w
from support.helpers import WORKER_TREE, ExecutorProcess, env_with, wait_for, worker_tree_pids

from executors import exitcodes
from executors.agent.workdir import (
    COMMAND_GROUP,
    TOKEN_ENV,
    new_token,
    reap_command,
    record_command,
)

WORKERS = WORKER_TREE


def stat(pid: int) -> tuple[str, int] | None:
    """(state, process group), None once the process is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return fields[0], int(fields[2])


def alive(pid: int) -> bool:
    st = stat(pid)
    return st is not None and st[0] not in ("Z", "X")


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of group ``pgid``, read from /proc."""
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit() and (st := stat(int(name))) and st[1] == pgid and st[0] not in "ZX":
            out.append(int(name))
    return out


@pytest.fixture
def bystander() -> Iterator[subprocess.Popen[bytes]]:
    """An unrelated process in a group of its own: no reaping may touch it."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "import signal; signal.pause()"], start_new_session=True
    )
    yield proc
    proc.kill()
    proc.wait()


def write_job(tmp_path: Path, out: Path) -> Path:
    script = tmp_path / "workers.py"
    script.write_text(WORKERS)
    job = {
        "name": "workers",
        "executor": "command",
        "steps": 1_000_000,
        "command": {
            "argv": [sys.executable, str(script), "leader", str(out)],
            "progress_regex": r"step (?P<step>\d+) loss (?P<loss>[0-9.]+)",
            "grace_s": 0.5,
            # the exec path's fence (it leads the command's group); a forked run's is in
            # test_command_zygote.py
            "preload": [],
        },
    }
    path = tmp_path / "job.toml"
    path.write_text(tomli_w.dumps(job))
    return path


def start(job: Path, work: Path) -> ExecutorProcess:
    return ExecutorProcess(["run", "--spec", str(job), "--workdir", str(work), "--json"])


def started(proc: ExecutorProcess) -> None:
    proc.wait_event(
        lambda e: e["kind"] == "log" and e["text"].startswith("command started"), 60, "the start"
    )


def test_a_sigkilled_executors_fence_ends_its_command_at_once(
    tmp_path: Path, bystander: subprocess.Popen[bytes]
) -> None:
    work, out = tmp_path / "w", tmp_path / "out"
    out.mkdir()
    first = start(write_job(tmp_path, out), work)
    old = wait_for(lambda: worker_tree_pids(out), 60, "the command's three processes")
    fence = json.loads((work / COMMAND_GROUP).read_text())["pgid"]
    assert alive(fence) and all(alive(p) for p in old.values())
    first.proc.kill()  # SIGKILL, the executor only: its fence and the command live on
    first.finish(30)
    wait_for(lambda: not any(alive(p) for p in [fence, *old.values()]), 10, "the whole run's end")
    assert alive(bystander.pid)
    (report,) = [json.loads(line) for line in (work / "fence.jsonl").read_text().splitlines()]
    assert report["fence"] == fence and "executor is gone" in report["why"]


def test_the_next_executor_reaps_the_workers_a_sigkilled_one_and_its_fence_left(
    tmp_path: Path, bystander: subprocess.Popen[bytes]
) -> None:
    work, first_out, second_out = tmp_path / "w", tmp_path / "first", tmp_path / "second"
    first_out.mkdir()
    second_out.mkdir()
    first = start(write_job(tmp_path, first_out), work)
    old = wait_for(lambda: worker_tree_pids(first_out), 60, "the command's three processes")
    record = json.loads((work / COMMAND_GROUP).read_text())
    pgid = record["pgid"]  # the fence's: it leads the command's group
    assert {stat(p)[1] for p in old.values()} == {pgid}, "one process group of its own"
    assert stat(bystander.pid)[1] != pgid
    token = f"{TOKEN_ENV}={record['token']}".encode()
    assert token in Path(f"/proc/{old['grandchild']}/environ").read_bytes().split(b"\0")

    first.proc.send_signal(signal.SIGSTOP)  # a host losing both at once: nothing fences the run
    os.kill(pgid, signal.SIGKILL)
    wait_for(lambda: not alive(pgid), 10, "the fence's death")
    first.proc.kill()
    first.finish(30)
    wait_for(lambda: not alive(old["leader"]), 10, "the leader's death signal")
    assert alive(old["child"]) and alive(old["grandchild"]), "workers outlive executor and fence"
    assert sorted(group_members(pgid)) == sorted([old["child"], old["grandchild"]])

    second = start(write_job(tmp_path, second_out), work)
    try:
        started(second)  # after the reap: it comes before anything starts
        assert group_members(pgid) == [], f"left alive: {group_members(pgid)}"
        assert not alive(old["child"]) and not alive(old["grandchild"])
        assert alive(bystander.pid)
        log = (work / "events.jsonl").read_text()
        assert (
            f"killed 2 process(es) the previous executor's command left running (process group {pgid})"
            in log
        )
        new = wait_for(lambda: worker_tree_pids(second_out), 60, "the new command's processes")
        assert alive(new["grandchild"])
        second.proc.send_signal(signal.SIGTERM)
        rc, err = second.finish(60)
        assert rc == exitcodes.PREEMPTED, err
    finally:
        if second.proc.poll() is None:
            second.proc.kill()
            second.finish()
    assert not [p for p in new.values() if alive(p)], "a normal end kills the workers too"
    assert not (work / COMMAND_GROUP).exists(), "a normal end removes the record"
    assert alive(bystander.pid)


def test_a_recorded_group_whose_processes_lack_the_token_is_not_ours(
    tmp_path: Path, bystander: subprocess.Popen[bytes]
) -> None:
    """A group id is reused once the group is empty: the token decides, not the number."""
    record_command(tmp_path, new_token(), bystander.pid)
    assert reap_command(tmp_path, timeout_s=5) == 0
    assert alive(bystander.pid)
    assert not (tmp_path / COMMAND_GROUP).exists()


def test_a_worker_that_left_the_group_still_dies_by_its_token(
    tmp_path: Path, bystander: subprocess.Popen[bytes]
) -> None:
    token = new_token()
    escaped = subprocess.Popen(
        [sys.executable, "-c", "import signal; signal.pause()"],
        start_new_session=True,
        env=env_with(**{TOKEN_ENV: token}),
    )
    try:
        record_command(tmp_path, token, None)  # the executor died before it knew the group
        wait_for(
            lambda: (
                f"{TOKEN_ENV}={token}".encode() in Path(f"/proc/{escaped.pid}/environ").read_bytes()
            ),
            10,
            "the process's environment",
        )
        assert reap_command(tmp_path, timeout_s=5) == 1
        assert escaped.wait(5) == -signal.SIGKILL
        assert alive(bystander.pid)
    finally:
        if escaped.poll() is None:
            escaped.kill()
            escaped.wait()


def test_no_run_starts_beside_processes_of_the_last_that_outlived_sigkill(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Processes stuck in the kernel (a GPU driver call) outlive SIGKILL: the next Start to the
    same executor must not launch beside them and overwrite their record. (Such a process
    cannot be made here; the reap's verdict is what is replaced.)"""
    import msgspec

    from executors.agent.control import Control
    from executors.agent.workdir import CommandLingers
    from executors.kinds.command import command_kind
    from protocol.messages import Fault, Log
    from protocol.spec import CommandSpec, JobSpec

    def lingering(workdir: Path, timeout_s: float = 10.0) -> int:
        raise CommandLingers(
            f"{workdir}: processes [4242] of the previous command outlived SIGKILL"
        )

    monkeypatch.setattr(command_kind, "reap_command", lingering)
    marker = tmp_path / "started"
    cs = msgspec.convert(
        {"argv": [sys.executable, "-c", f"open({str(marker)!r}, 'w').close()"]}, CommandSpec
    )
    spec = JobSpec(name="j", executor="command", steps=10, command=cs)
    events: list[object] = []
    runner = command_kind.CommandRunner(spec, cs, tmp_path / "w", events.append, control=Control())
    outcome = runner.run()
    assert outcome.reason == "crash" and outcome.exit_code == exitcodes.FAILED
    (fault,) = [e for e in events if isinstance(e, Fault)]
    assert fault.fatal and "outlived SIGKILL" in fault.message
    assert not [e for e in events if isinstance(e, Log) and e.text.startswith("command started")]
    assert not marker.exists(), "the command never ran"
