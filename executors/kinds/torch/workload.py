"""The workload interface: what the trainer needs from a model to train it resumably.

A workload is built by a factory ``factory(config: dict, ctx: WorkloadContext) -> Workload``,
named in a job spec either by a built-in name (``"charlm"``) or as ``"module:factory"``.
The trainer owns the loop, micro-batching, checkpoints, RNG state and the data position;
a workload provides the model, optimizer, scheduler, a deterministic batch for a data
position, and the loss of a micro-batch.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from protocol.errors import ConfigError
from protocol.workloads import unknown_workload

BUILTIN = {"charlm": "executors.kinds.torch.workloads.charlm:build"}

T = TypeVar("T")


@dataclass(frozen=True)
class WorkloadContext:
    seed: int
    device: torch.device
    rank: int = 0
    world_size: int = 1


class Workload(ABC):
    """One trainable job. Everything returned by ``state_dict`` must load with weights_only=True."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None
    global_batch: int
    micro_batch: int
    grad_clip: float | None = None

    @abstractmethod
    def batch(self, index: int) -> Sequence[torch.Tensor]:
        """The global batch at data position ``index``: a pure function of (seed, index)."""

    @abstractmethod
    def loss(self, micro: Sequence[torch.Tensor]) -> torch.Tensor:
        """Mean loss of one micro-batch (the first ``len`` rows of each tensor)."""

    def tokens(self, batch: Sequence[torch.Tensor]) -> int:
        """Tokens (or samples) in a batch, for throughput figures."""
        return int(batch[0].numel())

    def state_dict(self) -> dict[str, Any]:
        sd: dict[str, Any] = {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
        }
        if self.scheduler is not None:
            sd["lr_scheduler"] = self.scheduler.state_dict()
        return sd

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.model.load_state_dict(sd["model"])
        self.optimizer.load_state_dict(sd["optimizer"])
        if self.scheduler is not None:
            self.scheduler.load_state_dict(sd["lr_scheduler"])


Factory = Callable[[dict[str, Any], WorkloadContext], Workload]


def resolve(name: str) -> Factory:
    """A built-in workload name or ``"module:factory"``; an unknown name lists the valid ones."""
    target = BUILTIN.get(name, name)
    module, sep, attr = target.partition(":")
    if not sep or not module or not attr:
        raise ConfigError(f"workload: {unknown_workload(name)}")
    try:
        factory = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"workload: cannot load {name!r}: {e}") from None
    if not callable(factory):
        raise ConfigError(f"workload: {name!r} is not callable")
    return factory
