"""Logical ranks: which of a job's fixed data-parallel shares a physical rank runs, and their rows.

An elastic job's work is ``L`` logical ranks whatever the number of members ``W`` (W <= L):
physical rank ``p`` runs the contiguous block ``range(p*L//W, (p+1)*L//W)`` (3 logical ranks on
2 ranks: [0] and [1, 2]), and logical rank ``l`` always takes rows ``[l*B/L, (l+1)*B/L)`` of the
global batch ``B``, in micro-batches that divide them. A fixed-size group is the case L == W
(one logical rank per rank), a single host L == W == 1.
"""

from __future__ import annotations

from dataclasses import dataclass

from protocol.errors import ConfigError


def block(rank: int, world_size: int, logical_ranks: int) -> range:
    """The logical ranks physical rank ``rank`` of ``world_size`` runs (contiguous, in order)."""
    return range(rank * logical_ranks // world_size, (rank + 1) * logical_ranks // world_size)


@dataclass(frozen=True)
class Layout:
    """One physical rank's share of every step."""

    logical_ranks: int
    world_size: int
    rank: int
    global_batch: int
    micro_batch: int
    """The planned micro-batch (at most a logical rank's rows, and dividing them)."""

    @property
    def ranks(self) -> range:
        """This rank's logical ranks."""
        return block(self.rank, self.world_size, self.logical_ranks)

    @property
    def rows_per_logical(self) -> int:
        return self.global_batch // self.logical_ranks

    def rows(self, logical_rank: int) -> slice:
        """Logical rank ``logical_rank``'s rows of the global batch."""
        n = self.rows_per_logical
        return slice(logical_rank * n, (logical_rank + 1) * n)

    @property
    def local_rows(self) -> int:
        """Rows of each global batch this rank trains on."""
        return len(self.ranks) * self.rows_per_logical

    @property
    def widest_block(self) -> int:
        """The most logical ranks any physical rank runs (what a gather pads every rank's to)."""
        return max(
            len(block(p, self.world_size, self.logical_ranks)) for p in range(self.world_size)
        )

    def fit(self, micro_batch: int) -> int:
        """``micro_batch`` if it still divides a logical rank's rows, else the largest one below
        it that does (a micro-batch restored from a checkpoint written for other rows)."""
        rows = self.rows_per_logical
        return next(d for d in range(min(max(micro_batch, 1), rows), 0, -1) if rows % d == 0)

    def describe(self) -> str:
        r = self.ranks
        return (
            f"logical ranks {list(r)} of {self.logical_ranks} on rank {self.rank} of "
            f"{self.world_size} (rows {r.start * self.rows_per_logical}..{r.stop * self.rows_per_logical} "
            f"of {self.global_batch}, micro-batch {self.micro_batch})"
        )


def plan(
    global_batch: int,
    micro_batch: int,
    *,
    logical_ranks: int,
    world_size: int = 1,
    rank: int = 0,
    elastic: bool = True,
) -> Layout:
    """Rank ``rank`` of ``world_size``'s layout; a ConfigError (one line) when it cannot be.

    ``elastic`` only words the errors: False for a fixed-size group (its ranks are its logical
    ranks, and the spec did not name ``logical_ranks``).
    """
    unit = "logical ranks" if elastic else "ranks"
    if logical_ranks < 1:
        raise ConfigError(f"logical_ranks: {logical_ranks}; at least 1")
    if not 0 <= rank < world_size:
        raise ConfigError(f"rendezvous: rank {rank} outside 0..{world_size - 1}")
    if world_size > logical_ranks:
        raise ConfigError(
            f"logical_ranks: {logical_ranks} logical ranks cannot spread over {world_size} ranks "
            "(each rank needs at least one)"
        )
    if global_batch % logical_ranks:
        raise ConfigError(
            f"config.global_batch: {global_batch} rows do not split evenly over "
            f"{logical_ranks} {unit}"
        )
    rows = global_batch // logical_ranks
    micro = min(micro_batch, rows)
    if micro < 1 or rows % micro:
        per = "logical rank" if elastic else "rank"
        raise ConfigError(
            f"config.micro_batch: {micro} does not divide each {per}'s share of {rows} rows "
            f"(global batch {global_batch} over {logical_ranks} {unit})"
        )
    return Layout(logical_ranks, world_size, rank, global_batch, micro)
