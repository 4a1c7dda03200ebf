"""A CheckpointManager on real files in tests: the events it emits (``Events``), one made with the
tests' defaults (``manager``), and checkpoints of a small model saved at given steps."""

from __future__ import annotations

from pathlib import Path

import torch

from executors.checkpoints.checkpoint import CheckpointManager
from protocol.messages import ExecutorMessage, Fault


class Events(list):
    def __call__(self, msg: ExecutorMessage) -> None:
        self.append(msg)

    def faults(self) -> list[Fault]:
        return [m for m in self if isinstance(m, Fault)]


def manager(folder: Path, events: Events, **kw: object) -> CheckpointManager:
    args: dict = {
        "job": "j",
        "spec_hash": "h1",
        "keep": 3,
        "epoch": 0,
        "code_version": "test",
        "emit": events,
    }
    args.update(kw)
    return CheckpointManager(folder, **args)


def state(step: int, size: int = 1000) -> dict:
    return {"model": {"w": torch.full((size,), float(step))}, "train": {"step": step}}


def save_steps(m: CheckpointManager, *steps: int, size: int = 1000) -> None:
    for s in steps:
        m.save(s, state(s, size))
    m.wait()
