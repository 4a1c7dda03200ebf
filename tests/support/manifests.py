"""Checkpoint manifests and ``CheckpointSaved`` messages for tests that feed a console's
message handlers directly (no executor, no file on disk)."""

from __future__ import annotations

from protocol.messages import CheckpointSaved
from protocol.spec import CheckpointManifest


def manifest(
    step: int, *, job: str = "j", epoch: int = 1, node_rank: int | None = None, nnodes: int = 1
) -> CheckpointManifest:
    """A manifest of ``step`` that names no real file (size 1, a zero digest)."""
    return CheckpointManifest(
        job=job,
        step=step,
        file=f"step-{step:010d}.pt",
        size=1,
        sha256="0" * 64,
        epoch=epoch,
        spec_hash="x",
        code_version="x",
        created_at=0.0,
        node_rank=node_rank,
        nnodes=nnodes,
    )


def saved(man: CheckpointManifest) -> CheckpointSaved:
    """The executor's report that ``man``'s checkpoint is written."""
    return CheckpointSaved(manifest=man, path="-", manifest_path="-", write_s=0.0, stall_s=0.0)
