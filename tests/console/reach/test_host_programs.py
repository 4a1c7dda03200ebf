"""The programs the console runs on a host are real modules (``console/reach/host/``): they
name the workdir's files as the executor does, and each runs as shipped, from its source
alone, with an isolated interpreter (``-I -S``: nothing of the project importable), as on a
host that has only Python."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

from console.reach import deploy, job_ready, preflight, remote
from console.reach.host import kill, locked
from executors.agent import workdir
from executors.fencing import cgroup


def run(program: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-I", "-S", "-c", program, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": os.environ.get("PATH", "")},
    )


def test_the_kill_program_names_the_workdir_s_files_as_the_executor_does() -> None:
    assert kill.LOCK == workdir.LOCK
    assert kill.PID == workdir.PID
    assert kill.COMMAND_GROUP == workdir.COMMAND_GROUP
    assert kill.TOKEN_ENV == workdir.TOKEN_ENV
    assert kill.CGROUP_PREFIX == cgroup.PREFIX
    assert [s.value for s in remote.KillStatus] == [0, 10, 11, 12, 13]


def manifest(folder: Path, step: int, *, data: bool = True, pending: bool = False) -> None:
    stem = f"step-{step:010d}"
    (folder / f"{stem}.json").write_text(json.dumps({"step": step}))
    if data:
        (folder / f"{stem}.pt").write_bytes(b"x")
    if pending:
        (folder / f".{stem}.pending").write_text("")


def test_listing_counts_a_manifest_only_with_its_data_and_no_pending_marker(
    tmp_path: Path,
) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    manifest(a, 10)
    manifest(a, 20, data=False)
    manifest(a, 30, pending=True)
    manifest(b, 40)
    r = run(remote.LIST, str(a), str(b), str(tmp_path / "none"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert [[m["step"] for m in found] for found in json.loads(r.stdout)] == [[10], [40], []]


def test_the_lock_probe_tells_a_held_lock_from_a_free_one(tmp_path: Path) -> None:
    path = tmp_path / "executor.lock"
    assert run(remote.LOCKED, str(path), cwd=tmp_path).returncode == 0, "free (made if absent)"
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        assert run(remote.LOCKED, str(path), cwd=tmp_path).returncode == locked.HELD
    finally:
        os.close(fd)


def test_kill_in_a_workdir_no_executor_ran_in_kills_nothing(tmp_path: Path) -> None:
    r = run(remote.KILL, str(tmp_path), "5", cwd=tmp_path)
    assert r.returncode == kill.NOT_HELD, r.stderr
    assert json.loads(r.stdout)["why"] == "no executor.lock: no executor ran here"


def test_promote_refuses_a_replica_that_lists_a_path_outside_it_and_writes_nothing(
    tmp_path: Path,
) -> None:
    src, dst = tmp_path / "replicas", tmp_path / "checkpoints"
    src.mkdir()
    dst.mkdir()
    (dst / "keep").write_text("the executor's own")
    stem = "step-0000000010"
    (src / f"{stem}.pt").mkdir()
    files = [{"path": "../../escape", "size": 1, "sha256": "0" * 64}]
    (src / f"{stem}.json").write_text(
        json.dumps({"step": 10, "size": 1, "sha256": "0" * 64, "files": files})
    )
    r = run(remote.PROMOTE, str(src), str(dst), stem, cwd=tmp_path)
    assert r.returncode == 1 and r.stderr.startswith(f"{stem}: "), r.stderr
    assert (dst / "keep").read_text() == "the executor's own", "nothing written"
    assert not (tmp_path.parent / "escape").exists()


def test_the_preflight_probe_answers_from_its_source_alone(tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / ".complete").write_text("")
    r = run(preflight.PROBE, str(tmp_path / "root" / "not-made"), str(bundle), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    facts = json.loads(r.stdout)
    assert facts["python"] == ".".join(map(str, sys.version_info[:3]))
    assert facts["bundle"] is True
    assert facts["disk_free_mb"] > 0, "judged by the folder it will be made in"
    assert not (tmp_path / "root").exists(), "it creates nothing"
    assert facts["containment"] in ("cgroup", "fence")


def test_extract_unpacks_a_bundle_whole(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.py").write_text("x = 1\n")
    with tarfile.open(tmp_path / "b.tar", "w") as t:
        t.add(tmp_path / "src" / "a.py", arcname="pkg/a.py")
    r = run(deploy.EXTRACT, str(tmp_path / "b.tar"), str(tmp_path / "out"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "out" / "pkg" / "a.py").read_text() == "x = 1\n"


def test_the_job_probe_answers_from_its_source_alone(tmp_path: Path) -> None:
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "train.py").write_text("")
    order = {
        "timeout": 30,
        "jobs": [
            {
                "job": "j",
                "cwd": str(tmp_path / "code"),
                "check_cwd": True,
                "argv": [sys.executable, "train.py", "--out", "{checkpoint_dir}"],
                "env": {},
                "needs": ["data/shard-0.bin"],
                "imports": ["json", "no_such_module_x1"],
            }
        ],
    }
    r = run(job_ready.PROBE, json.dumps(order), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    problems = json.loads(r.stdout)["problems"]
    code = tmp_path / "code"
    assert problems == [
        ["j", "command.needs[0]", f"{code}/data/shard-0.bin does not exist (cwd {code})"],
        [
            "j",
            "command.imports[1]",
            f"module no_such_module_x1 is not found by {sys.executable} (cwd {code})",
        ],
    ]
