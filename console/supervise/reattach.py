"""A console started while a job had an epoch takes the members that still train it (one host's
executor alike: a group of one); a member that cannot be reached is waited out under the
persisted lease bound, never taken for gone."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Awaitable, Callable

from console.fleet.link import ExecutorLink, LinkError
from console.records.journal import Journal, Kind
from console.records.state_store import JobRecord
from console.states import JobState
from console.supervise.group.commit import Commits
from console.supervise.group.epoch import GroupEpoch
from console.supervise.incident import OpenIncident
from console.supervise.lease import JobLease
from console.supervise.live import LiveJob, Transitions
from console.supervise.member import Member
from console.supervise.outcome import Exit, Outcome
from protocol.messages import ExecutorState


def recorded_members(rec: JobRecord, one_host: bool) -> list[str]:
    """The member hosts the job's record names, by node rank: its members; for a job on one
    host (``one_host``), a record with its host and no members (written for a single host's
    executor) names a group of one, whose executor is reattached, not started anew."""
    if rec.members:
        return list(rec.members)
    return [rec.host] if one_host and rec.host else []


class Reattach:
    """Given the job's live view, its lease and commits, whether it runs on one host, a link
    to a host's executor, the members' assignment, how an epoch is watched (``epoch``), how an
    executor not taken is retired, the hosts whose executor waits warm, how orders are
    steered, its state moves, incident and journal, and what follows a reattach (the twin
    kept, a drain found)."""

    def __init__(
        self,
        live: LiveJob,
        *,
        lease: JobLease,
        commits: Commits,
        one_host: bool,
        link: Callable[[str], ExecutorLink],
        assign: Callable[[list[str]], None],
        epoch: Callable[[list[Member], int], GroupEpoch],
        retire: Callable[[ExecutorLink, str], Awaitable[None]],
        warm: set[str],
        steer: Callable[[], None],
        states: Transitions,
        incident: OpenIncident,
        journal: Journal,
        after: Callable[[], None],
    ) -> None:
        self._live = live
        self._lease = lease
        self._commits = commits
        self._one_host = one_host
        self._link = link
        self._assign = assign
        self._epoch = epoch
        self._retire = retire
        self._warm = warm
        self._steer = steer
        self._states = states
        self._incident = incident
        self._journal = journal
        self._after = after
        self.pending = False
        """Reattached at console start to an epoch some member of which did not answer then:
        once every one answers (alive, slow), the job reads reattached (``done``)."""

    async def attach(self, *, again: bool) -> GroupEpoch | None:
        """A console started while the group had an epoch: take the members that still train
        it; a member that cannot be reached is waited out under the persisted lease bound
        (it may still be training), never taken for gone. ``again``: an operator started the
        job again (nothing is reattached)."""
        job = self._live
        plan = recorded_members(job.rec, self._one_host)
        if not plan or job.epoch == 0 or again:
            # started again by an operator: its last epoch ended as this console saw (stopped,
            # failed), and what its members' events say of it is no news (a stop read back
            # from them failed the job again as stopped)
            return None
        self._lease.restore()
        self._assign(plan)
        members = [Member(r, h, until=self._lease.until) for r, h in enumerate(plan)]
        run = self._epoch(members, job.epoch)
        self._commits.new_epoch(job.epoch, len(plan))
        for m in members:
            link = self._link(m.host)
            try:
                hello = await link.open(timeout=2)
            except LinkError:
                continue  # unreachable: its lease is waited out by the epoch's watch
            if hello.epoch == job.epoch and hello.state in (
                ExecutorState.TRAINING,
                ExecutorState.STOPPING,
            ):
                m.link, m.last_seen, m.step = link, time.monotonic(), hello.step
                with contextlib.suppress(LinkError):
                    await link.send(run.grant(m))
            elif hello.epoch == job.epoch and hello.state == ExecutorState.FAULTED:
                self._warm.add(m.host)
                link.close()
                run.ended(m, Outcome(Exit.RUN_CRASHED, f"the run on {m.host} had ended"))
            else:
                await self._retire(link, m.host)
                link.close()
                run.ended(m, Outcome(Exit.CRASHED, f"no executor of epoch {job.epoch} on {m.host}"))
        linked = [m for m in members if m.link is not None]
        self._steer()  # rank 0's link, else the first linked member's
        if len(linked) == len(members):
            self.done(members)
        else:
            self.pending = True
            self._states.move(
                JobState.PENDING,
                f"{len(members) - len(linked)} member(s) not at epoch {job.epoch} at console "
                f"start: waiting out their lease ({max(0.0, self._lease.left()):.0f} s left at "
                "most); the group restarts once it ends",
            )
        return run

    def done(self, members: list[Member]) -> None:
        """Every member of the epoch this console found trains it, linked: at console start,
        or once one silent then (alive, slow to answer) answers."""
        job = self._live
        self.pending = False
        job.step = max(m.step for m in members)
        if job.incident is not None:  # a console restart: the group never stopped
            job.resumed_step = job.step
            self._incident.phase("loaded", step=job.step, last_step=job.step)
        pids = [
            f"executor pid {m.link.hello.pid if m.link and m.link.hello else '?'} on {m.host}"
            for m in members
        ]
        self._journal.record(
            Kind.EXECUTOR,
            f"{job.name}: reattached to "
            + (
                f"all {len(members)} members at epoch {job.epoch} ({', '.join(pids)})"
                if len(members) > 1
                else pids[0]  # a group of one: as one host's ("executor pid N on a")
            ),
            job=job.name,
            host=members[0].host,
            data={"epoch": job.epoch, "members": [m.host for m in members]},
        )
        self._states.move(JobState.RUNNING, "reattached")
        self._after()
