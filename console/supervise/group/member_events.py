"""What a member's silence, answer, loss or failing GPU does to a multi-host job: the job reads
unreachable while a member is silent and as before once none is, and the incident a member's
failure opens names that member. What members say goes to the one dispatcher every job has
(``messages.JobMessages``)."""

from __future__ import annotations

import asyncio
import contextlib

from console.fleet.link import ExecutorLink, LinkError
from console.states import JobState
from console.supervise.incident import OpenIncident
from console.supervise.live import LiveJob, Transitions
from console.supervise.member import Member
from protocol.faults import StopReason
from protocol.messages import Abandon, Drain, Stop


async def send_quietly(link: ExecutorLink, msg: Drain | Stop | Abandon) -> None:
    """Send, unless the link is gone (then what it would have ordered no longer matters)."""
    with contextlib.suppress(LinkError):
        await link.send(msg)


class MemberEvents:
    """A member's silence, answer, loss and planned move, as the job sees them."""

    def __init__(self, live: LiveJob, *, states: Transitions, incident: OpenIncident) -> None:
        self._live = live
        self._states = states
        self._incident = incident
        self._before = JobState.RUNNING
        """What the job read before a member's silence made it unreachable."""

    def move(self, m: Member, reason: StopReason, why: str) -> None:
        """``m``'s rank leaves its host (its GPU fails a health rule): the group stops at a
        step with a checkpoint (a Drain to one member stops every member at the same step)
        and its next epoch puts that rank on another host."""
        self.open_incident(m, reason.value, why, planned=True)
        self._states.move(JobState.CHECKPOINTING, why)
        if m.link is not None:
            asyncio.get_running_loop().create_task(send_quietly(m.link, Drain(reason=reason)))

    def silent(self, m: Member) -> None:
        """``m`` went silent: the job waits out its lease (it reads unreachable meanwhile)."""
        job = self._live
        if job.state in (JobState.RUNNING, JobState.CHECKPOINTING):
            self._before = job.state
            self._states.move(
                JobState.UNREACHABLE, f"{m.host} silent: waiting out the lease on {m.host}"
            )

    def answered(self, m: Member, linked: list[Member]) -> None:
        """``m`` answers again after a silence (a blip): once no member of the epoch is
        silent, the job reads as it did before."""
        job = self._live
        if job.state is JobState.UNREACHABLE and all(x.link is not None for x in linked):
            self._states.move(self._before, f"{m.host} answers again")

    def lost(self, m: Member, why: str, fault_class: str) -> None:
        """``m``'s silence is decided a loss (its lease ran out; ``host_lost``: its host cannot
        be reached, ``executor_hang``: it can, the executor is frozen): an incident names it,
        dated from its last heartbeat. A silence that ends in a relink is a blip, none opens."""
        self.open_incident(m, fault_class, f"{m.host}: {why}")

    def open_incident(self, m: Member, fault_class: str, why: str, planned: bool = False) -> None:
        # the incident names the member that failed, and its fault time is when it went silent
        self._incident.open(fault_class, why, planned=planned, member=(m.host, m.last_seen))
