"""One executor of a job, as its supervision sees it in one epoch: a group's member by node
rank, or a single host's executor (node rank 0). What it says goes to one dispatcher
(``messages.JobMessages``) whichever kind the job is."""

from __future__ import annotations

from dataclasses import dataclass

from console.fleet.link import ExecutorLink
from console.supervise.outcome import Outcome


@dataclass
class Member:
    """One executor of a job in this epoch, by node rank: a group's member, or a single
    host's executor (node rank 0 of a group of one)."""

    node_rank: int
    host: str
    link: ExecutorLink | None = None
    last_seen: float = 0.0
    """When its executor was last heard from (monotonic)."""
    until: float = 0.0
    """``clock.mono()`` past which the newest lease granted to it has surely ended (skew not added)."""
    exit: Outcome | None = None
    """How its run ended this epoch."""
    exit_at: float = 0.0
    step: int = 0
    waiting: bool = False
    """Its run ended and its executor waits, alive, for the next epoch's Start (RunEnded): kept
    under lease, so it is still there, warm, when the group restarts."""
