"""What an executor says that updates its job, the same for a single host's executor and a
group's members: called by the one dispatcher every job has (``messages.JobMessages``).

- rank 0's progress is the job's step, loss and pace, and ends its incident once training got
  past the step it resumed from;
- the step rank 0 resumed from is the incident's ``loaded`` phase;
- a log line or a fault goes to the job's log tail (a group's with its member's host);
- each checkpoint written is journalled (a group's with its shard);
- a checkpoint past the step a restart resumed from forgives the restarts (``restart_limit``
  bounds a crash loop, not crashes ever), and says so in the journal.

What differs by kind stays with the dispatcher's collaborators: how a run's end is counted (a
single host's is the job's; a group's comes from every member: ``GroupEpoch``),
what a checkpoint commits (a single host's at once; a group's once every shard is written)
and what a GPU failing a health rule moves (the job, or one member's rank).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from console import clock
from console.records.journal import Journal, Kind
from console.records.lineage import journal_fields
from console.supervise.incident import OpenIncident, trained_past
from console.supervise.live import LiveJob
from console.supervise.restart import owed, paid_off
from protocol.messages import CheckpointSaved, Progress, Resumed


def _clock() -> str:
    return time.strftime("%H:%M:%S")


class JobSaid:
    """The job-wide effects of what its executors say (see the module's docstring)."""

    def __init__(
        self,
        live: LiveJob,
        *,
        journal: Journal,
        incident: OpenIncident,
        progress: Callable[[Progress], None],
        save: Callable[[], object],
    ) -> None:
        self._live = live
        self._journal = journal
        self._incident = incident
        self._progress = progress
        """Tell the console of a Progress message (it journals some)."""
        self._save = save
        """Persist the job's record."""

    def progressed(self, msg: Progress) -> None:
        """Rank 0 trained a step."""
        job = self._live
        job.last_seen = time.monotonic()
        job.step, job.loss, job.steps_per_s = msg.step, msg.loss, msg.steps_per_s
        job.history.append((clock.wall(), msg.step, msg.loss, msg.steps_per_s))
        if msg.steps_per_s > 0:
            job.rates[msg.world_size] = (msg.steps_per_s, clock.wall())
        resumed = job.resumed_step
        if job.incident is not None and resumed is not None and trained_past(msg, resumed):
            self._incident.phase("first_step", step=msg.step)
            job.incident = None
        self._progress(msg)

    def resumed(self, msg: Resumed) -> None:
        """Rank 0 loaded the step it trains on from."""
        self._live.resumed_step = msg.step
        self._incident.phase("loaded", step=msg.step, load_s=msg.load_s, checkpoint=msg.checkpoint)

    def line(self, text: str, host: str | None = None) -> None:
        """A line for the job's log tail, stamped (``host``: the member that said it)."""
        self._live.log_tail.append(f"{_clock()} {host + ' ' if host else ''}{text}")

    def checkpoint(self, host: str, msg: CheckpointSaved, *, shard: int | None = None) -> None:
        """A checkpoint written on ``host`` (``shard``: a group member's part of its step)."""
        man, name = msg.manifest, self._live.name
        what = (
            f"shard {shard} of step {man.step}"
            if shard is not None
            else f"checkpoint step {man.step}"
        )
        self._journal.record(
            Kind.CHECKPOINT,
            f"{name}: {what} on {host}",
            job=name,
            host=host,
            data={
                "step": man.step,
                "bytes": man.size,
                "stall_s": msg.stall_s,
                "write_s": msg.write_s,
                "epoch": man.epoch,
                **({"shard": shard} if shard is not None else {}),
                **journal_fields(man),
            },
        )

    def committed(self, step: int, host: str | None) -> None:
        """``step`` is the job's newest whole checkpoint: past the step a restart resumed
        from, it forgives the restarts, and the journal says so."""
        job = self._live
        if not owed(job.rec) or step <= (job.resumed_step or 0):
            return
        self._journal.record(
            Kind.EXECUTOR,
            f"{job.name}: checkpoint at step {step} after {job.rec.restarts} restart(s); "
            "the restart count starts again",
            job=job.name,
            host=host,
            data={"restarts": job.rec.restarts, "step": step},
        )
        paid_off(job.rec)
        self._save()
