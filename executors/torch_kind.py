"""The built-in ``torch`` executor kind: a workload trained by ``executors.trainer``."""

from __future__ import annotations

from pathlib import Path

from executors.control import Control
from executors.inject import Injections
from executors.publish import Emit
from executors.trainer import Trainer, pick_device
from protocol.spec import JobSpec


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
        return Trainer(
            spec, workdir, emit, control=control, device=pick_device(device), injections=injections
        )
