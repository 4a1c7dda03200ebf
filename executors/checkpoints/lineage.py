"""A checkpoint's lineage as its writer knows it at start: host, workload code, data.

``at_start`` runs once per start (a run of the trainer or of a command); the checkpoint
writers add each checkpoint's parent (``descend``). What each field holds, exactly:

- ``host``: this machine's hostname.
- ``code_hash`` (the torch kind): sha256 over the source files of the module the spec's
  ``workload`` names (for a built-in name, the module it stands for) and of the module that
  defines the factory, when that is another one. A module inside a package stands for every
  ``.py`` file directly in its package's folder (its siblings, so a model split over a few
  files is covered; subpackages are not), a top-level module for its own file. Each file adds
  its module path (``executors/kinds/torch/workloads/charlm.py``), a NUL, its bytes and a NUL, in path
  order; ``code_files`` lists those paths. A module without a source file (a namespace
  package, an extension) or a file that cannot be read: no code hash.
- ``git_commit`` and ``git_dirty`` (the command kind): ``git rev-parse --verify HEAD`` and
  ``git status --porcelain --untracked-files=no`` in the command's cwd, run directly (never
  through a shell) with a timeout; untracked files do not make it dirty. Not a repository,
  no git, or git too slow: none, and the checkpoint is written all the same.
- ``data``: what the spec names as data: the ``config`` entries whose key contains ``data``
  or ``corpus`` (any case; ``dataset`` and ``data_path`` too) and, for the command kind, such
  ``env`` entries and argv flags (``--data-path X``, ``--dataset=X``), as ``key=value``
  separated by spaces: config then env, each by key, then flags in argv order (a value that is
  not a string as JSON); None when nothing names data. A workload's default that the spec
  does not write (charlm's built-in corpus) is not there; the data's bytes are not hashed.
"""

from __future__ import annotations

import hashlib
import os
import re
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from protocol.spec import CheckpointManifest, JobSpec, Lineage

GIT_TIMEOUT_S = 5.0
"""Each git command; a repository on a hung network mount must not hold up the start."""
DATA_KEY = re.compile(r"data|corpus", re.IGNORECASE)
_FLAG = re.compile(r"^--?(?P<name>[A-Za-z0-9][A-Za-z0-9_.-]*)(?:=(?P<value>.*))?$", re.DOTALL)
_SHA = re.compile(r"^[0-9a-f]{40}([0-9a-f]{24})?$")


def at_start(
    spec: JobSpec,
    *,
    run_id: str = "",
    factory: Callable[..., Any] | None = None,
    cwd: Path | None = None,
) -> Lineage:
    """This start's lineage: the run id (empty: started without a console), the workload's
    code hash with ``factory`` (the torch kind), the git state of ``cwd`` with it (the
    command kind); no parent yet."""
    code = workload_code(spec.workload, factory) if factory is not None else None
    git = git_state(cwd) if cwd is not None else None
    return Lineage(
        host=socket.gethostname(),
        run_id=run_id or None,
        code_hash=code[0] if code else None,
        code_files=code[1] if code else [],
        git_commit=git[0] if git else None,
        git_dirty=git[1] if git else None,
        data=data_source(spec),
    )


def bare() -> Lineage:
    """The lineage of a writer told nothing of its start: the host, and parents as they come."""
    return Lineage(host=socket.gethostname())


def descend(base: Lineage, parent: CheckpointManifest | None) -> Lineage:
    """``base`` with ``parent`` (None: a fresh start) as the checkpoint's parent."""
    return msgspec.structs.replace(
        base,
        parent_step=parent.step if parent else None,
        parent_sha256=parent.sha256 if parent else None,
    )


def workload_code(workload: str, factory: Callable[..., Any]) -> tuple[str, list[str]] | None:
    """(sha256, module paths of the files hashed), or None when a module has no source file."""
    from executors.kinds.torch.workload import (
        BUILTIN,  # imports torch, which the command kind never needs
    )

    named = BUILTIN.get(workload, workload).partition(":")[0]
    modules = dict.fromkeys(m for m in (named, getattr(factory, "__module__", None)) if m)
    files: dict[str, Path] = {}
    for name in modules:
        found = module_files(name)
        if found is None:
            return None
        files.update(found)
    h = hashlib.sha256()
    try:
        for rel in sorted(files):
            h.update(rel.encode() + b"\0" + files[rel].read_bytes() + b"\0")
    except OSError:
        return None
    return h.hexdigest(), sorted(files)


def module_files(name: str) -> dict[str, Path] | None:
    """An imported module's source files by module path: its package folder's ``.py`` files,
    or a top-level module's own file; None without a source file."""
    module = sys.modules.get(name)
    source = getattr(module, "__file__", None)
    if module is None or not source or not source.endswith(".py"):
        return None
    path = Path(source)
    package = module.__package__ or ""
    if not package:
        return {path.name: path}
    prefix = package.replace(".", "/")
    return {f"{prefix}/{p.name}": p for p in sorted(path.parent.glob("*.py")) if p.is_file()}


def git_state(cwd: Path, timeout_s: float = GIT_TIMEOUT_S) -> tuple[str, bool | None] | None:
    """(HEAD commit, dirty) of the repository ``cwd`` is in; dirty None when git status
    failed; None when it is not in one or git cannot say."""
    head = _git(["rev-parse", "--verify", "HEAD"], cwd, timeout_s)
    if head is None or not _SHA.match(head.strip()):
        return None
    status = _git(["status", "--porcelain", "--untracked-files=no"], cwd, timeout_s)
    return head.strip(), None if status is None else bool(status.strip())


def _git(args: list[str], cwd: Path, timeout_s: float) -> str | None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env |= {"GIT_OPTIONAL_LOCKS": "0", "GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C"}
    try:
        done = subprocess.run(
            ["git", "-C", str(cwd), *args],
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            env=env,
            timeout=timeout_s,
            check=False,
        )
    except (OSError, subprocess.SubprocessError, UnicodeDecodeError):
        return None
    return done.stdout if done.returncode == 0 else None


def data_source(spec: JobSpec) -> str | None:
    """What the spec names as data, as ``key=value`` pairs (the module docstring says which)."""
    pairs = [(k, v) for k, v in sorted(spec.config.items()) if DATA_KEY.search(k)]
    cs = spec.command if spec.executor == "command" else None
    if cs is not None:
        pairs += [(k, v) for k, v in sorted(cs.env.items()) if DATA_KEY.search(k)]
        pairs += _data_flags(cs.argv)
    return " ".join(f"{k}={_text(v)}" for k, v in pairs) or None


def _data_flags(argv: list[str]) -> list[tuple[str, str]]:
    found = []
    for i, arg in enumerate(argv):
        m = _FLAG.match(arg)
        if m is None or not DATA_KEY.search(m["name"]):
            continue
        if m["value"] is not None:
            found.append((m["name"], m["value"]))
        elif i + 1 < len(argv) and not argv[i + 1].startswith("-"):
            found.append((m["name"], argv[i + 1]))
    return found


def _text(value: object) -> str:
    return value if isinstance(value, str) else msgspec.json.encode(value).decode()
