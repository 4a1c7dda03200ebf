"""Where and how a job's members meet each epoch: the rendezvous every member's Start carries
(rank 0's data address and a fresh master port, ranks per host, the backend, the collective
timeout), one for a group of one too."""

from __future__ import annotations

import random
from collections.abc import Callable

from console.inventory import Inventory
from protocol.messages import Backend, Rendezvous

PORTS = (20000, 30000)
"""The master port of each epoch is drawn from this range (a new one each epoch: a port left
in TIME_WAIT, or taken, costs one failed epoch, not the job)."""


def next_port(last: int | None, draw: Callable[[int, int], int] = random.randrange) -> int:
    """A master port from ``PORTS`` unlike the previous epoch's, whose sockets may linger."""
    port = draw(PORTS[0], PORTS[1] - 1)
    return port + 1 if last is not None and port >= last else port


class Meeting:
    """Given the job's name, its spec's kind and the inventory."""

    def __init__(self, name: str, *, executor: str, inv: Inventory) -> None:
        self._name = name
        self._executor = executor
        self._inv = inv
        self._placement = inv.jobs[name].placement
        self.collective_timeout_s = max(10.0, inv.console.lease_s)
        self._last_port: int | None = None

    def rendezvous(self, plan: list[str], resume: int | None) -> Rendezvous:
        """Node rank 0's rendezvous of a new epoch on ``plan``, resuming from ``resume``; each
        member's is this with its own node rank. A port unlike the last epoch's."""
        self._last_port = port = next_port(self._last_port)
        return Rendezvous(
            node_rank=0,
            addresses=[self._inv.data_address(h) for h in plan],
            master_port=port,
            procs_per_host=self.procs_per_host(plan),
            backend=self.backend(plan),
            resume_step=resume,
            timeout_s=self.collective_timeout_s,
            logical_ranks=self._inv.logical_ranks(self._name),
            deterministic_reduce=self._placement.deterministic_reduce,
        )

    def procs_per_host(self, plan: list[str]) -> int:
        """Ranks on each host of ``plan``: the job's own, else one for the torch kind, else the
        fewest GPUs of a member (at least one)."""
        if self._placement.procs_per_host is not None:
            return self._placement.procs_per_host
        if self._executor == "torch":
            return 1  # the torch kind: one rank per host unless asked (bit-exact with before)
        return max(1, min(self._inv.hosts[h].gpus for h in plan))

    def backend(self, plan: list[str]) -> Backend:
        """The job's own, else NCCL where every host of ``plan`` has a GPU, else gloo."""
        if self._placement.backend:
            return Backend(self._placement.backend)
        return Backend.NCCL if all(self._inv.hosts[h].gpus > 0 for h in plan) else Backend.GLOO
