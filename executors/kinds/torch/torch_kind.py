"""The built-in ``torch`` executor kind: a workload trained by ``executors.kinds.torch.trainer``."""

from __future__ import annotations

import os
from pathlib import Path

from executors.agent import run_env
from executors.agent.control import Control
from executors.agent.inject import Injections
from executors.fencing.publish import Emit
from executors.kinds.torch.trainer import Trainer, pick_device
from protocol.spec import JobSpec

PROGRESS_ENV = "HOTSPARE_PROGRESS_S"
"""Seconds between Progress reports (default 0.5); tests set 0 to see every step's loss."""


class TorchKind:
    name = "torch"

    def runner(
        self,
        spec: JobSpec,
        workdir: Path,
        emit: Emit,
        *,
        control: Control,
        device: str | None,
        injections: Injections,
    ) -> Trainer:
        run_env.export(spec.name, control)
        return Trainer(
            spec,
            workdir,
            emit,
            control=control,
            device=pick_device(device),
            injections=injections,
            progress_interval_s=float(os.environ.get(PROGRESS_ENV, "0.5")),
        )
