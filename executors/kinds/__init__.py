"""Executor kinds are plug-ins: the ``hotspare.executors`` entry point group, plus the built-ins.

A kind is a class with ``name`` and ``runner(spec, workdir, emit, *, control, device,
injections)`` returning an object whose ``run()`` gives an ``Outcome``; it may also have
``prepare(spec, workdir, emit, stopped)``, called on an idle executor told ``Prepare`` (a start
of ``spec`` may follow) to ready what that start needs without training (``stopped``: the
executor is ending). A kind may also have idle work (``Idle``): what an executor of it does
while it waits for Start, found apart from the kind (the ``hotspare.executors.idle`` group) so
that finding it imports nothing of the runner. The built-ins resolve without package
metadata, because a host runs the executor from a copied bundle.
"""

from __future__ import annotations

import importlib
import threading
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
IDLE_GROUP = "hotspare.executors.idle"
BUILTIN_IDLE = {"torch": "executors.kinds.torch.warm:TorchIdle"}
"""The command kind has none: its idle work is ``prepare`` (a job's zygote), told by Prepare."""


@dataclass(frozen=True)
class Outcome:
    """How a runner's ``run()`` ended: the executor's exit code, the step, why."""

    exit_code: int
    step: int
    reason: str
    params_sha256: str | None = None


class Runner(Protocol):
    def run(self) -> Outcome: ...


class Idle(Protocol):
    """What an idle executor of a kind does before any Start (a spare waiting for one)."""

    def before_serving(self) -> None:
        """On the main thread, before the executor's socket exists (no console holds a lease
        on it yet): what must not run beside a Started run, such as an import that holds the
        GIL for seconds."""
        ...

    def warm_up(self, over: threading.Event, repeat_s: float) -> None:
        """On its own thread: pay what the first step would (imports, lazy kernel setup).
        ``repeat_s``: the ``slow_warmup@S`` test hook; return early once ``over`` is set."""
        ...

    def until_started(self, started: threading.Event, workdir: Path) -> None:
        """After the warm-up, until ``started`` is set: ready what a Start will load (the
        newest checkpoint in ``workdir``, read ahead and verified)."""
        ...


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


def load_idle(name: str) -> Idle | None:
    """The idle work of the kind called ``name``, if it has any (importing nothing heavy)."""
    if name in BUILTIN_IDLE:
        return _load(BUILTIN_IDLE[name])()  # type: ignore[no-any-return]
    found = {ep.name: ep for ep in entry_points(group=IDLE_GROUP)}
    if name not in found:
        return None
    try:
        return found[name].load()()  # type: ignore[no-any-return]
    except Exception as e:  # noqa: BLE001 - a broken plug-in is a config error, reported in one line
        raise ConfigError(
            f"executor: plug-in {name!r}'s idle work failed to load: {type(e).__name__}: {e}"
        ) from None
