"""``hotspare check`` looks for a ``command`` job's code and data on every host it may run on
(issue 28): its ``cwd``, ``argv[0]``, the script or ``-m`` module, ``needs`` and ``imports``,
one line per problem naming the job, host, key and path, exit 1. Before, a spare without the
script passed ``check`` and the job failed there only when it failed over.

The local hosts share this machine's disk, so each job's code sits beside a host's root
(``cwd = "../../src-JOB"``, relative to the workdir ``ROOT/jobs/JOB``): host a has all of it,
spare b what each case leaves out."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support.fleetbed import job_table, local_host, write_inventory
from support.helpers import REPO, env_with

PYTHON = sys.executable


def hotspare(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "console.cli", *args],
        capture_output=True,
        text=True,
        env=env_with(),
        cwd=REPO,
        timeout=timeout,
    )


def command_job(
    name: str,
    host: str | list[str] | None = "a",
    spares: tuple[str, ...] = ("b",),
    **command: Any,
) -> dict[str, Any]:
    """A command-kind job on ``host`` (a list: a group's members) with ``spares`` (no host:
    it may start anywhere), its cwd ``ROOT/src-NAME`` on each host."""
    place: dict[str, Any] = (
        {"region": "r1"}
        if host is None
        else {"hosts": host}
        if isinstance(host, list)
        else {"host": host, "spares": list(spares)}
    )
    return {
        **place,
        "executor": "command",
        "steps": 10,
        "command": {"cwd": f"../../src-{name}", "checkpoint_glob": "ckpt-*.pt", **command},
    }


JOBS = {
    "script": command_job("script", argv=[PYTHON, "train.py", "--ckpt", "{checkpoint_dir}"]),
    "data": command_job("data", argv=[PYTHON, "-u", "train.py"], needs=["data/shard0.bin"]),
    "imports": command_job("imports", argv=[PYTHON, "train.py"], imports=["torch", "no_such_module_xyz"]),
    "module": command_job("module", ["a", "b"], argv=[PYTHON, "-m", "mypkg.train", "--steps", "{steps}"]),
    "program": command_job("program", argv=["./run.sh", "{resume_from}"]),
    "nocwd": command_job("nocwd", argv=[PYTHON, "train.py"], needs=["data"]),
    "roam": command_job("roam", host=None, argv=[PYTHON, "train.py"]),
}  # fmt: skip


def code(root: Path, job: str, *, missing: frozenset[str] = frozenset()) -> None:
    """Job ``job``'s code and data beside ``root``, less what ``missing`` names."""
    src = root / f"src-{job}"
    if "cwd" in missing:
        return
    (src / "data").mkdir(parents=True)
    if "train.py" not in missing:
        (src / "train.py").write_text("print('training')\n")
    if "shard0.bin" not in missing:
        (src / "data" / "shard0.bin").write_bytes(b"\0" * 16)
    if "mypkg" not in missing:
        (src / "mypkg").mkdir()
        # imported, it leaves a mark: check only finds it
        (src / "mypkg" / "__init__.py").write_text("open(__file__ + '.imported', 'w').close()\n")
        (src / "mypkg" / "train.py").write_text("raise SystemExit('never imported by check')\n")
    if "run.sh" not in missing:
        (src / "run.sh").write_text("#!/bin/sh\nexit 0\n")
        (src / "run.sh").chmod(0o755)


def fleet(
    tmp_path: Path, jobs: dict[str, dict[str, Any]], missing_on_b: dict[str, set[str]]
) -> Path:
    a, b = tmp_path / "a", tmp_path / "b"
    for job in jobs:
        code(a, job)
        code(b, job, missing=frozenset(missing_on_b.get(job, set())))
    return write_inventory(
        tmp_path / "inventory.toml",
        hosts={"a": local_host(a), "b": local_host(b, role="spare")},
        jobs=jobs,
    )


def job_lines(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.startswith("job ")]


def no_traceback(r: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in r.stdout + r.stderr, r.stdout + r.stderr
    assert r.stderr == ""


def status(stdout: str, host: str) -> str:
    row = next(line for line in stdout.splitlines() if line.split()[:1] == [host])
    return row.split()[-1]


def test_each_missing_piece_is_one_line_naming_job_host_key_and_path(tmp_path: Path) -> None:
    inventory = fleet(
        tmp_path,
        JOBS,
        missing_on_b={
            "script": {"train.py"},
            "data": {"shard0.bin"},
            "module": {"mypkg"},
            "program": {"run.sh"},
            "nocwd": {"cwd"},
            "roam": {"train.py"},
        },
    )
    a, b = (tmp_path / "a").resolve(), (tmp_path / "b").resolve()
    r = hotspare("--inventory", str(inventory), "check")
    no_traceback(r)
    assert r.returncode == 1, r.stdout
    assert job_lines(r.stdout) == [
        f"job imports on host a: command.imports[1]: module no_such_module_xyz is not found by "
        f"{PYTHON} (cwd {a}/src-imports)",
        f"job script on host b: command.argv[1]: {b}/src-script/train.py does not exist "
        f"(cwd {b}/src-script)",
        f"job data on host b: command.needs[0]: {b}/src-data/data/shard0.bin does not exist "
        f"(cwd {b}/src-data)",
        f"job imports on host b: command.imports[1]: module no_such_module_xyz is not found by "
        f"{PYTHON} (cwd {b}/src-imports)",
        f"job module on host b: command.argv[2]: module mypkg (of mypkg.train) is not found by "
        f"{PYTHON} (cwd {b}/src-module)",
        f"job program on host b: command.argv[0]: {b}/src-program/run.sh does not exist "
        f"(cwd {b}/src-program)",
        # a missing cwd is said once, not again for each path in it
        f"job nocwd on host b: command.cwd: {b}/src-nocwd does not exist",
        f"job roam on host b: command.argv[1]: {b}/src-roam/train.py does not exist "
        f"(cwd {b}/src-roam)",
    ]
    assert (status(r.stdout, "a"), status(r.stdout, "b")) == ("FAIL", "FAIL")
    assert not (tmp_path / "a" / "jobs").exists() and not (tmp_path / "b" / "jobs").exists(), (
        "check only looks: no workdir made"
    )

    js = hotspare("--inventory", str(inventory), "check", "--json")
    no_traceback(js)
    assert js.returncode == 1
    by_host = {d["host"]: d for d in json.loads(js.stdout)["hosts"]}
    assert by_host["b"]["ok"] is False and by_host["a"]["ok"] is False
    lines = job_lines(r.stdout)
    assert by_host["a"]["problems"] == [x for x in lines if " on host a: " in x]
    assert by_host["b"]["problems"] == [x for x in lines if " on host b: " in x]


def test_a_ready_fleet_checks_ok_without_a_job_line(tmp_path: Path) -> None:
    jobs = {
        **JOBS,
        "imports": command_job("imports", argv=[PYTHON, "train.py"], imports=["torch", "mypkg"]),
        "placeholders": command_job(
            "placeholders",
            argv=[PYTHON, "{workdir}/gen.py"],
            needs=["{checkpoint_dir}/nowhere", "data"],
        ),
        # no cwd: the workdir, which the executor makes; nothing there to look for
        "workdir": {"host": "a", "spares": ["b"], "executor": "command", "steps": 10,
                    "command": {"argv": ["sh", "-c", "exit 0"]}},
        "torch": {"host": "a", "spares": ["b"], **job_table(steps=10)},
    }  # fmt: skip
    inventory = fleet(tmp_path, jobs, missing_on_b={})
    r = hotspare("--inventory", str(inventory), "check")
    no_traceback(r)
    assert r.returncode == 0, r.stdout
    assert job_lines(r.stdout) == []
    assert (status(r.stdout, "a"), status(r.stdout, "b")) == ("ok", "ok")
    assert list(tmp_path.rglob("*.imported")) == [], "a module is found, never imported"
    assert not (tmp_path / "a" / "jobs").exists(), "no workdir made"


def one_host(tmp_path: Path, **command: Any) -> Path:
    a = tmp_path / "a"
    code(a, "odd")
    return write_inventory(
        tmp_path / "inventory.toml",
        hosts={"a": local_host(a)},
        jobs={"odd": command_job("odd", spares=(), **command)},
    )


BAD = {
    "not a module name": (
        {"imports": ["no such"]},
        "imports: 'no such' is not a module name (like torch or a.b)",
    ),
    "an empty path": ({"needs": [""]}, "needs[0]: empty, not a path"),
    "a NUL in a path": ({"needs": ["data", "da\0ta"]}, "needs[1]: a NUL character, not a path"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_entry_is_one_line_as_the_inventory_loads(tmp_path: Path, case: str) -> None:
    command, said = BAD[case]
    inventory = one_host(tmp_path, argv=[PYTHON, "train.py"], **command)
    r = hotspare("--inventory", str(inventory), "check")
    assert "Traceback" not in r.stdout + r.stderr
    assert (r.returncode, r.stdout) == (2, ""), r.stdout + r.stderr
    assert r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith(f"hotspare: {inventory}:"), r.stderr
    assert r.stderr.endswith(f": jobs.odd.command: {said}\n"), r.stderr


def test_a_control_character_in_argv0_is_one_printable_line(tmp_path: Path) -> None:
    inventory = one_host(tmp_path, argv=["run\x01me"])
    r = hotspare("--inventory", str(inventory), "check")
    no_traceback(r)
    assert r.returncode == 1, r.stdout
    (line,) = job_lines(r.stdout)
    assert line.startswith("job odd on host a: command.argv[0]: run\\x01me is not found on PATH (")


def test_over_ssh_the_spare_without_the_script_is_named(ssh_hosts, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The probe runs with the host's python over its real ssh transport (argv, not a shell
    line: a path with a space and a quote arrives whole)."""
    good, bare = ssh_hosts(2)
    for host, has in ((good, True), (bare, False)):
        src = host.root / "it's src"
        src.mkdir()
        if has:
            (src / "train.py").write_text("print('training')\n")
    job = {
        "host": "good",
        "spares": ["bare"],
        "executor": "command",
        "steps": 10,
        "command": {
            "argv": ["python3", "train.py"],
            "cwd": "../../it's src",
            "imports": ["no_such_module_xyz"],
        },
    }
    inventory = write_inventory(
        tmp_path / "inventory.toml",
        hosts={"good": good.inventory_table(), "bare": bare.inventory_table()},
        jobs={"j": job},
    )
    r = hotspare("--inventory", str(inventory), "check")
    no_traceback(r)
    assert r.returncode == 1, r.stdout
    lines = job_lines(r.stdout)
    python3 = lines[0].split(" is not found by ")[1].split(" (")[0]
    assert os.path.basename(python3).startswith("python3") and os.path.isabs(python3), lines
    src_good, src_bare = good.root / "it's src", bare.root / "it's src"
    assert lines == [
        f"job j on host good: command.imports[0]: module no_such_module_xyz is not found by "
        f"{python3} (cwd {src_good})",
        f"job j on host bare: command.argv[1]: {src_bare}/train.py does not exist (cwd {src_bare})",
        f"job j on host bare: command.imports[0]: module no_such_module_xyz is not found by "
        f"{python3} (cwd {src_bare})",
    ]
