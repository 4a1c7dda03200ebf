"""Two-phase commit of a multi-host job's checkpoints: a step is committed only once every
member reported its shard of that step written and verified (CheckpointSaved) under the
current epoch. Only committed steps are resumed from; a half-written step is never loaded.
"""

from __future__ import annotations

from collections.abc import Callable

from console.records.state_store import JobRecord

KEPT = 16
"""Committed steps remembered (oldest dropped): a resume needs one its shards are all kept for."""


class Commits:
    def __init__(self, rec: JobRecord, save: Callable[[], object], nnodes: int) -> None:
        self._rec = rec
        self._save = save
        self.nnodes = nnodes
        self._written: dict[int, set[int]] = {}
        """Step -> node ranks whose shard of it was reported under the current epoch."""
        self.epoch = -1

    def new_epoch(self, epoch: int, nnodes: int) -> None:
        """Reports of an earlier epoch never count towards a commit of this one; ``nnodes``:
        the members of this one (an elastic group's size changes between epochs)."""
        self.epoch, self.nnodes = epoch, nnodes
        self._written.clear()

    def saved(self, node_rank: int, step: int, epoch: int) -> int | None:
        """A member's shard of ``step`` is written; the step if that committed it (persisted)."""
        if epoch != self.epoch or not 0 <= node_rank < self.nnodes:
            return None
        if self.committed is not None and step <= self.committed:
            return None
        ranks = self._written.setdefault(step, set())
        ranks.add(node_rank)
        if len(ranks) < self.nnodes:
            return None
        for s in [s for s in self._written if s <= step]:
            del self._written[s]
        self._rec.committed = [*self._rec.committed, step][-KEPT:]
        self._save()
        return step

    def pending(self) -> dict[int, list[int]]:
        """Steps some members wrote and others not yet: step -> node ranks written."""
        return {s: sorted(r) for s, r in sorted(self._written.items())}

    @property
    def committed(self) -> int | None:
        return self._rec.committed[-1] if self._rec.committed else None

    def steps(self) -> list[int]:
        """Committed steps, newest first."""
        return sorted(self._rec.committed, reverse=True)
