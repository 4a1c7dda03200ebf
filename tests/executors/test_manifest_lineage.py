"""Lineage in every manifest, read back from disk after real runs of ``hotspare-executor run``:
the torch kind's workload code hash and the command kind's git state, the data, the host, and
each checkpoint's parent across a resume."""

from __future__ import annotations

import hashlib
import itertools
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest
import tomli_w
from support.helpers import REPO, env_with, run_job, write_spec

from executors.checkpoints.lineage import data_source, git_state, module_files, workload_code
from executors.kinds.torch.workload import resolve
from protocol.spec import CheckpointManifest, CommandSpec, JobSpec

PLAIN = REPO / "tests" / "train_plain.py"


def manifests(work: Path) -> list[CheckpointManifest]:
    return [
        msgspec.json.decode(p.read_bytes(), type=CheckpointManifest)
        for p in sorted((work / "checkpoints").glob("step-*.json"))
    ]


def assert_chain(found: list[CheckpointManifest]) -> None:
    """Each manifest's parent is the one before it: its step and the sha256 of its bytes."""
    for before, after in itertools.pairwise(found):
        assert after.lineage is not None
        assert (after.lineage.parent_step, after.lineage.parent_sha256) == (
            before.step,
            before.sha256,
        )


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return done.stdout.strip()


def charlm_code_hash() -> str:
    """Computed here from the files on disk: every .py file of executors/kinds/torch/workloads."""
    h = hashlib.sha256()
    for path in sorted((REPO / "executors" / "kinds" / "torch" / "workloads").glob("*.py")):
        h.update(
            f"executors/kinds/torch/workloads/{path.name}".encode()
            + b"\0"
            + path.read_bytes()
            + b"\0"
        )
    return h.hexdigest()


def test_torch_kind_manifests_carry_code_data_host_and_a_parent_chain_across_a_resume(
    tmp_path: Path,
) -> None:
    work = tmp_path / "w"
    over: dict[str, Any] = {"checkpoint_every_steps": 10, "keep_checkpoints": 10}
    first = run_job(write_spec(tmp_path / "a.toml", steps=30, **over), work)
    assert first.returncode == 0, first.stderr
    again = run_job(write_spec(tmp_path / "b.toml", steps=50, **over), work)
    assert again.returncode == 0, again.stderr
    assert again.of("resumed")[0]["step"] == 30
    found = manifests(work)
    assert [m.step for m in found] == [10, 20, 30, 40, 50]
    lineages = [m.lineage for m in found]
    assert all(x is not None for x in lineages)
    first_ckpt = lineages[0]
    assert first_ckpt is not None
    assert (first_ckpt.parent_step, first_ckpt.parent_sha256) == (None, None), "a fresh start"
    assert_chain(found)  # 40's parent is 30: the checkpoint the second run resumed from
    for x in lineages:
        assert x is not None
        assert x.host == socket.gethostname()
        assert x.code_hash == charlm_code_hash()
        assert x.code_files == [
            f"executors/kinds/torch/workloads/{p.name}"
            for p in sorted((REPO / "executors" / "kinds" / "torch" / "workloads").glob("*.py"))
        ]
        assert x.data == "corpus_chars=20000", "the data keys the spec's config names"
        assert x.git_commit is None, "the torch kind hashes its workload's code instead"


def command_job(path: Path, cwd: Path, steps: int) -> Path:
    argv = [sys.executable, str(PLAIN), "--checkpoint-dir", "{checkpoint_dir}"]
    argv += ["--resume", "{resume_from}", "--steps", "{steps}", "--marker"]
    command = {
        "argv": argv,
        "cwd": str(cwd),
        "env": {"OMP_NUM_THREADS": "1", "DATA_DIR": "/datasets/tiny"},
        "checkpoint_glob": "ckpt-*.pt",
        "complete_marker": "{name}.done",
    }
    spec = {"name": "plain", "executor": "command", "steps": steps, "keep_checkpoints": 10}
    path.write_text(tomli_w.dumps({**spec, "command": command}))
    return path


def test_command_kind_manifests_carry_the_git_state_of_its_cwd_and_a_parent_chain(
    tmp_path: Path,
) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "train.cfg").write_text("lr = 0.1\n")
    git(repo, "add", "train.cfg")
    git(repo, "commit", "-q", "-m", "first")
    head = git(repo, "rev-parse", "HEAD")
    work = tmp_path / "w"
    clean = run_job(command_job(tmp_path / "a.toml", repo, 20), work)
    assert clean.returncode == 0, clean.stderr
    (repo / "train.cfg").write_text("lr = 0.2\n")  # a tracked file changed: dirty
    dirty = run_job(command_job(tmp_path / "b.toml", repo, 40), work)
    assert dirty.returncode == 0, dirty.stderr
    found = manifests(work)
    assert [m.step for m in found] == [10, 20, 30, 40]
    states = [(m.lineage.git_commit, m.lineage.git_dirty) for m in found if m.lineage]
    assert states == [(head, False), (head, False), (head, True), (head, True)]
    assert found[0].lineage is not None and found[0].lineage.parent_step is None
    assert_chain(found)  # 30's parent is 20: what the second run restored
    for m in found:
        assert m.lineage is not None
        assert m.lineage.host == socket.gethostname()
        assert m.lineage.data == "DATA_DIR=/datasets/tiny"
        assert m.lineage.code_hash is None


def test_a_command_outside_a_repository_or_without_git_still_checkpoints(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    assert git_state(plain) is None, "not in a repository"
    no_git = env_with(PATH=str(tmp_path / "empty-bin"))  # the executor's argv is absolute
    proc = run_job(command_job(tmp_path / "job.toml", REPO, 20), tmp_path / "w", env=no_git)
    assert proc.returncode == 0, proc.stderr
    found = manifests(tmp_path / "w")
    assert [m.step for m in found] == [10, 20]
    assert all(m.lineage is not None and m.lineage.git_commit is None for m in found), (
        "no git on PATH: no commit (REPO is a repository), and the checkpoints all the same"
    )


def hash_of(files: dict[str, Path]) -> str:
    h = hashlib.sha256()
    for rel in sorted(files):
        h.update(rel.encode() + b"\0" + files[rel].read_bytes() + b"\0")
    return h.hexdigest()


def test_a_module_factory_workload_hashes_its_package_and_the_module_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``top_level:build`` re-exports ``mypkg.model.build``: the named module's own file, and
    every .py file directly in mypkg (not its subpackage, not its neighbours outside it)."""
    pkg = tmp_path / "mypkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "model.py").write_text("def build(config, ctx):\n    raise NotImplementedError\n")
    (pkg / "layers.py").write_text("WIDTH = 64\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "notes.txt").write_text("not code\n")
    (tmp_path / "top_level.py").write_text("from mypkg.model import build\n")
    (tmp_path / "neighbour.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        factory = resolve("top_level:build")
        code = workload_code("top_level:build", factory)
        expected = {
            "top_level.py": tmp_path / "top_level.py",
            "mypkg/__init__.py": pkg / "__init__.py",
            "mypkg/layers.py": pkg / "layers.py",
            "mypkg/model.py": pkg / "model.py",
        }
        assert code == (hash_of(expected), sorted(expected))
        (pkg / "layers.py").write_text("WIDTH = 128\n")  # a sibling the model imports changed
        changed = workload_code("top_level:build", factory)
        assert changed is not None and changed[0] == hash_of(expected) != code[0]
        assert module_files("no.such.module") is None
    finally:
        for name in ("top_level", "mypkg", "mypkg.model"):
            sys.modules.pop(name, None)


def test_data_is_what_the_spec_names_as_data() -> None:
    spec = JobSpec(
        name="d",
        executor="command",
        steps=1,
        config={"data": {"shards": 4}, "lr": 0.1, "Corpus": "wiki"},
        command=CommandSpec(
            argv=["python", "train.py", "--data-path", "/d", "--dataset=c4", "--lr", "0.1"],
            env={"HF_DATASET": "x", "OMP_NUM_THREADS": "1"},
        ),
    )
    assert data_source(spec) == (
        'Corpus=wiki data={"shards":4} HF_DATASET=x data-path=/d dataset=c4'
    )
    assert data_source(JobSpec(name="d", steps=1, config={"lr": 0.1})) is None
