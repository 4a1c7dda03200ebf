"""A view's copy of the jobs, told by the controller that owns them.

A view in another process watches the hosts itself (as a read-only console does), but what
only the controller knows (a job's state and why, a failover waiting for an operator) it asks
the controller for, about once a second, and shows that instead of its own guess.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, Protocol

from console.states import JobState
from console.supervise.live import LiveJob


class HasLive(Protocol):
    live: LiveJob


class HoldsJob(Protocol):
    job: str | None


def tell(
    jobs: Mapping[str, HasLive], hosts: Mapping[str, HoldsJob], status: Mapping[str, Any]
) -> None:
    """Set each job's state, why and waiting approval, and the job each host holds, to the
    controller's (``status``)."""
    held = status.get("host_jobs", {})
    for host, rt in hosts.items():
        rt.job = held.get(host)
    for name, said in status.get("jobs", {}).items():
        sup = jobs.get(name)
        if sup is None:
            continue
        live = sup.live
        live.told = True
        try:
            live.machine.state = JobState(said["state"])
        except ValueError:
            continue  # a state this view does not know (another release): its own guess stays
        live.why = str(said.get("why", ""))
        if not said.get("awaiting"):
            live.approval = None
        elif live.approval is None or live.approval.done():
            live.approval = asyncio.get_running_loop().create_future()  # answered there


def untell(jobs: Mapping[str, HasLive]) -> None:
    """The controller stopped answering: the view's own observation is shown again."""
    for sup in jobs.values():
        sup.live.told = False
        sup.live.approval = None


__all__ = ["tell", "untell"]
