"""Executor kinds are plug-ins: the ``hotspare.executors`` entry point group, plus the built-ins.

A kind is a class with ``name`` and ``runner(spec, workdir, emit, *, control, device,
injections)`` returning an object whose ``run()`` gives an ``Outcome``; it may also have
``prepare(spec, workdir, emit, stopped)``, called on an idle executor told ``Prepare`` (a start
of ``spec`` may follow) to ready what that start needs without training (``stopped``: the
executor is ending). The built-ins
resolve without package metadata, because a host runs the executor from a copied bundle.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from protocol.errors import ConfigError

if TYPE_CHECKING:
    from executors.agent.control import Control
    from executors.agent.inject import Injections
    from executors.fencing.publish import Emit
    from protocol.spec import JobSpec

GROUP = "hotspare.executors"
BUILTIN = {
    "torch": "executors.kinds.torch.torch_kind:TorchKind",
    "command": "executors.kinds.command.command_kind:CommandKind",
}


@dataclass(frozen=True)
class Outcome:
    """How a runner's ``run()`` ended: the executor's exit code, the step, why."""

    exit_code: int
    step: int
    reason: str
    params_sha256: str | None = None


class Runner(Protocol):
    def run(self) -> Outcome: ...


class ExecutorKind(Protocol):
    name: str

    def runner(
        self,
        spec: JobSpec,
        workdir: Path,
        emit: Emit,
        *,
        control: Control,
        device: str | None,
        injections: Injections,
    ) -> Runner: ...


def _load(target: str) -> Any:
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def load_kind(name: str) -> ExecutorKind:
    """The kind called ``name``; an unknown name lists the valid ones."""
    if name in BUILTIN:
        return _load(BUILTIN[name])()
    found = {ep.name: ep for ep in entry_points(group=GROUP)}
    if name not in found:
        valid = sorted(set(BUILTIN) | set(found))
        raise ConfigError(
            f"executor: unknown executor kind {name!r}; available: {', '.join(valid)}"
        )
    try:
        return found[name].load()()
    except Exception as e:  # noqa: BLE001 - a broken plug-in is a config error, reported in one line
        raise ConfigError(
            f"executor: plug-in {name!r} failed to load: {type(e).__name__}: {e}"
        ) from None
