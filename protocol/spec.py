"""Job specification and checkpoint manifest: the records both ends agree on.

The same job keys sit in a standalone job TOML and under ``[jobs.NAME]`` of an
inventory; placement keys (host, region, spares, priority) belong to the console.
"""

from __future__ import annotations

import hashlib
from typing import Annotated, Any

import msgspec

JOB_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
PLACEMENT_KEYS = frozenset({"host", "region", "spares", "priority", "warm_standby"})

JobName = Annotated[str, msgspec.Meta(pattern=JOB_NAME_PATTERN)]
PositiveInt = Annotated[int, msgspec.Meta(gt=0)]
PositiveFloat = Annotated[float, msgspec.Meta(gt=0)]


class JobSpec(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """What to train and how often to checkpoint it."""

    name: JobName
    """Job name; also a folder name, so letters, digits, '.', '_' and '-' only."""
    executor: str = "torch"
    """Executor kind (a plug-in of the ``hotspare.executors`` entry point group)."""
    workload: str = "charlm"
    """A built-in workload name or ``"module:factory"``."""
    steps: PositiveInt
    """Optimizer steps to run in all."""
    seed: int = 0
    checkpoint_every_steps: PositiveInt | None = None
    checkpoint_every_s: PositiveFloat | None = None
    """Either or both; with neither, a checkpoint every 30 s."""
    keep_checkpoints: PositiveInt = 3
    """How many complete checkpoints to keep on this host."""
    config: dict[str, Any] = {}
    """Workload settings (model size, global batch, micro-batch, learning rate, data)."""

    def state_hash(self) -> str:
        """Hash of what decides the training state; a checkpoint from another hash is not loaded.

        ``steps`` and the checkpoint cadence are left out so a run can be extended.
        """
        key = {"workload": self.workload, "seed": self.seed, "config": self.config}
        return hashlib.sha256(msgspec.json.encode(key, order="sorted")).hexdigest()[:16]


class CheckpointManifest(msgspec.Struct, kw_only=True):
    """Written beside a checkpoint after its data file is durable; the checkpoint's completion mark."""

    job: str
    step: int
    file: str
    size: int
    sha256: str
    epoch: int
    spec_hash: str
    code_version: str
    created_at: float
    format: int = 1
