"""A checkpoint an executor wrote and the console never heard of, read from its events.jsonl.

A run that ended says at which step it checkpointed last; if the console never heard that
``CheckpointSaved`` (its link closed, or was relinked, before it was read; or no console was
there to hear it), the checkpoint is taken from the executor's events as if it had come over
the link, so the job resumes there, not from the one before. One path for every job: a
single host's executor and each member of a group (whose shards of one step then commit it).
Found so: a group's last step left uncommitted at its finish; a preemption's checkpoint at the stop lost 11 steps on a single host (19 when it came
while no console watched); a group preempted while no console watched resumed 12 steps back.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from console.records.journal import Journal, Kind
from console.supervise.live import LiveJob
from console.supervise.member import Member
from console.supervise.messages import JobMessages
from console.supervise.outcome import Exit, Outcome

READ_BACK_TIMEOUT_S = 30.0
"""Reading an ended run's events.jsonl for a checkpoint its link did not deliver."""

LINK_CLOSED = "its link closed before it said so"
NO_CONSOLE = "no console was there to hear it"


class ReadBack:
    """Given the job, where a checkpoint read back goes (the dispatcher every job has) and how
    an ended executor's events are read (``Probe.ended``)."""

    def __init__(
        self,
        live: LiveJob,
        *,
        messages: JobMessages,
        ended: Callable[[str], Awaitable[Outcome]],
        journal: Journal,
    ) -> None:
        self._live = live
        self._messages = messages
        self._ended = ended
        self._journal = journal

    async def read_back(self, m: Member, outcome: Outcome, unheard: str = LINK_CLOSED) -> None:
        """``m``'s run ended with ``outcome``: a checkpoint of this epoch newer than any heard
        from it is dispatched as if heard (one host's is the job's; a group's shard counts
        towards its step's commit)."""
        job = self._live
        if outcome.exit is Exit.CONFIG or (
            outcome.exit is Exit.STOPPED and not outcome.peer_stopped
        ):
            return  # the job goes nowhere (a group's member stopped with its peers: it does)
        known = self._messages.newest_step(m)
        # a finish says its step, not whether it checkpointed there: no checkpoint is past
        # it, so the events are read only while one may be unheard. A group's shard of the
        # last step lost on its link (relinked under load) left that step uncommitted at the
        # finish, every other member's shard of it on disk and on the spare.
        upto = outcome.step if outcome.exit is Exit.FINISHED else outcome.checkpoint_step
        said = upto if upto is not None else -1
        saved = outcome.saved
        if max(said, saved.manifest.step if saved else -1) <= known:
            return
        if saved is None or saved.manifest.step < said:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(READ_BACK_TIMEOUT_S):
                    saved = (await self._ended(m.host)).saved
        if saved is None or saved.manifest.epoch != job.epoch or saved.manifest.step <= known:
            return
        self._journal.record(
            Kind.EXECUTOR,
            f"{job.name}: checkpoint step {saved.manifest.step} read back from the events of "
            f"the executor on {m.host} ({unheard})",
            job=job.name,
            host=m.host,
            data={"step": saved.manifest.step, "read_back": True, "node_rank": m.node_rank},
        )
        self._messages.on_message(m, saved)
