"""The warm standby (``warm_standby``): an idle executor readied on the job's first fit spare
before anything fails, which a rank moved to that spare takes (``WarmExecutors.executor``),
so a failover there is a Start, not a process start. Its link has one reader while it waits
(heartbeats and health keep the spare's state current); the taker relinks to it.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

from console.fleet.hosts import Fleet
from console.fleet.link import ExecutorLink, LinkError
from console.records.journal import Journal, Kind
from console.states import JobState
from console.supervise.launcher import Launcher
from console.supervise.live import LiveJob
from console.supervise.outcome import Outcome
from console.supervise.probe import Probe
from console.supervise.unless_down import HostLost, unless_down
from protocol.faults import StopReason
from protocol.messages import ExecutorMessage, Health, Heartbeat, Stop


@dataclass
class Prepared:
    """An idle executor on a host other than the job's, ready to be told Start."""

    host: str
    link: ExecutorLink


class Standby:
    def __init__(
        self,
        live: LiveJob,
        *,
        fleet: Fleet,
        journal: Journal,
        launcher: Launcher,
        probe: Probe,
    ) -> None:
        self._live = live
        self._fleet = fleet
        self._journal = journal
        self._launcher = launcher
        self._probe = probe
        self.warm: Prepared | None = None
        """The warm standby on the first spare, when the job asks for one."""
        self._warm_task: asyncio.Task[None] | None = None
        self._warm_on: str | None = None
        """The host the newest warm standby was started on."""
        self._pumps: dict[ExecutorLink, asyncio.Task[str]] = {}
        """Each link's reader, keyed by the link itself (held: its id cannot be reused while
        it is here); a finished one is dropped once another link is pumped."""
        self._keeping = False
        """The job keeps a warm standby (``keep_warm`` was called): it follows the spares."""

    # ------------------------------------------------------------- starting

    async def start(self, host: str) -> ExecutorLink | Outcome:
        """The warm standby's idle executor on ``host``, linked and pumped; or why not (its
        coming up is no incident's phase)."""
        started = await self._launcher.start(host, released=self._freed, standby=True)
        if isinstance(started, ExecutorLink):
            self.pump(started)
        return started

    def _freed(self, host: str) -> None:
        """A host readied for this job and then not used is free for others again."""
        if host != self._live.host:
            self._fleet.free(host, self._live.name, f"{self._live.name} readied it for nothing")
        self._fleet.changed.set()

    def _not_usable(self, prepared: Prepared) -> str:
        """Why the standby is not taken by the rank placed on its host (for the journal)."""
        host, rt = prepared.host, self._fleet.hosts[prepared.host]
        if not self.pumping(prepared.link):
            return "its link is gone"
        unfit = self._host_unfit(host)
        if unfit is not None:
            return unfit
        if rt.job not in (None, self._live.name):
            return f"{host} was taken by job {rt.job}"
        return f"the operator chose {self._live.target}"

    def _usable(self, prepared: Prepared) -> bool:
        """A readied executor the job may still start on: linked, its host fit and not taken
        by another job meanwhile (a warm standby does not hold its spare: the spare serves
        every job that names it), and the target an operator chose, if one did."""
        rt = self._fleet.hosts[prepared.host]
        return (
            self.pumping(prepared.link)
            and self._fleet.fit(prepared.host)
            and rt.job in (None, self._live.name)
            and self._live.target in (None, prepared.host)
        )

    async def discard(self, prepared: Prepared) -> None:
        """Stop a readied executor that will not be used, and wait until it has let go of the
        workdir: the next executor started there (a failover may pick the same host again)
        must not find it still holding the lock and serving the socket."""
        if prepared.link.hello is not None:
            self._launcher.dismissed.add((prepared.host, prepared.link.hello.pid))
        told = ""
        try:
            await prepared.link.send(Stop(reason=StopReason.NOT_NEEDED, checkpoint=False))
        except LinkError as e:
            told = f" (the Stop was not sent: {e})"
        await prepared.link.finish()  # read to its close: a Stop closed on at once was lost
        if prepared.host == self._live.host:
            return
        gone = await self._probe.wait_gone(prepared.host)
        if gone is not True:
            # it never heard the Stop (fresh-clone runs: the standby on a spare whose GPU fell
            # off sat there until its idle exit), or a loaded machine could not tell (the probe
            # unanswered: a second such run): ended by the pid that holds its lock, if any
            seen = "did not stop" if gone is False else "could not be seen to stop"
            self._journal.record(
                Kind.EXECUTOR,
                f"{self._live.name}: the idle executor on {prepared.host} {seen} when told it "
                f"is not needed{told}; killing it",
                job=self._live.name,
                host=prepared.host,
            )
            await self._probe.kill(prepared.host, self._probe.workdir(prepared.host))
        self._fleet.free(
            prepared.host, self._live.name, f"{self._live.name} readied it for nothing"
        )

    # ------------------------------------------------------------------ pumps

    def pump(self, link: ExecutorLink) -> asyncio.Task[str]:
        """One reader per link while the standby waits (its heartbeats and health are the
        spare's).

        Keyed by the link, not by ``id(link)``: a link freed left its finished reader under its
        id, and a new link given the same address was taken as pumped already (its reader
        never started), so a warm standby that had just come up read as "its link is gone"
        and a second executor was started beside it (fresh-clone runs, a drain while the
        standby still started: test_warm_standby_default, test_standby_pumps)."""
        task = self._pumps.get(link)
        if task is None:
            for other in [k for k, t in self._pumps.items() if t.done()]:
                del self._pumps[other]
            task = asyncio.create_task(link.pump(lambda msg: self._route(link, msg)))
            self._pumps[link] = task
        return task

    def pumping(self, link: ExecutorLink) -> bool:
        task = self._pumps.get(link)
        return link.hello is not None and task is not None and not task.done()

    def _route(self, link: ExecutorLink, msg: ExecutorMessage) -> None:
        host = link.transport.name
        if isinstance(msg, Heartbeat):
            self._fleet.seen(host)
        elif isinstance(msg, Health):
            self._fleet.observe(host, msg)

    # ------------------------------------------------------------ warm standby

    def keep_warm(self) -> None:
        """Ready the warm standby in the background (see ``_keep_warm``). One readying at a
        time: a restart in place launches the job again while the standby of its first launch
        may still be starting, and a second task beside it started a second executor on the
        spare's workdir (refused) and replaced the first task's handle, so dropping the
        standby when the job ended missed the one that came up."""
        self._keeping = True
        if self._warm_task is not None and not self._warm_task.done():
            return
        self._warm_task = asyncio.create_task(self._keep_warm(), name=f"{self._live.name} standby")

    async def _keep_warm(self) -> None:
        """An idle executor on the first free, fit spare, readied for the job (``Prepare``: torch
        imported and warmed up, a command's zygote importing), waiting for Start. It does not
        take the spare (``HostRuntime.job``): another job that names it may still go there."""
        job = self._live
        spare = self._first_fit_spare()
        current = self.warm
        if current is not None and current.host == spare and self.pumping(current.link):
            return
        if current is not None:
            self.warm = None
            self._journal.record(
                Kind.EXECUTOR,
                f"{job.name}: warm standby on {current.host} stopped: {self._unfit(current)}",
                job=job.name,
                host=current.host,
                data={"standby": True},
            )
            await self.discard(current)
        self._warm_on = spare
        if spare is None:
            return
        started = await self.start(spare)
        if isinstance(started, ExecutorLink):
            self.warm = Prepared(spare, started)
            self._journal.record(
                Kind.EXECUTOR,
                f"{job.name}: warm standby ready on {spare}",
                job=job.name,
                host=spare,
                data={"standby": True},
            )

    def starting_on(self) -> str | None:
        """The spare a warm standby is being started on now, if one is."""
        task = self._warm_task
        return self._warm_on if task is not None and not task.done() else None

    async def take_warm(self, host: str) -> Prepared | None:
        """The warm standby, for a group's member placed on ``host``: None unless it is there
        and still fit to use; taken, it is this Standby's no longer (its link is the
        taker's to close: its reader ends with it). One still starting there is waited for,
        unless its host is found down meanwhile: an executor started beside it on its
        workdir would be refused, as a single host's failover found."""
        starting = self._warm_task
        if starting is not None and not starting.done() and self._warm_on == host:
            with contextlib.suppress(HostLost):
                await unless_down(
                    self._fleet,
                    lambda: self._warm_on,
                    asyncio.gather(starting, return_exceptions=True),
                )
        warm = self.warm
        if warm is None or warm.host != host:
            return None
        self.warm = None
        if not self._usable(warm):  # an executor started there instead says why (the journal)
            self._journal.record(
                Kind.EXECUTOR,
                f"{self._live.name}: the warm standby on {host} is not used: "
                + self._not_usable(warm),
                job=self._live.name,
                host=host,
                data={"standby": True},
            )
            await self.discard(warm)
            return None
        return warm

    def _first_fit_spare(self) -> str | None:
        job, fleet = self._live, self._fleet
        return next(
            (s for s in job.spares if fleet.fit(s) and fleet.hosts[s].job in (None, job.name)),
            None,
        )

    def _unfit(self, warm: Prepared) -> str:
        """Why the standby ``warm`` is given up (for the journal)."""
        host = warm.host
        if not self.pumping(warm.link):
            return "its executor is gone"
        if host not in self._live.spares:
            return f"{host} is no longer a spare of the job"
        return self._host_unfit(host) or f"the first fit spare is {self._first_fit_spare()}"

    def _host_unfit(self, host: str) -> str | None:
        """Why ``host`` is no place for the job (the health rules it fails, else its state),
        or None when it is fit."""
        if self._fleet.fit(host):
            return None
        failing = "; ".join(f.message for f in self._fleet.failing(host))
        return failing or f"{host} is {self._fleet.hosts[host].state.value}"

    def follow_spares(self) -> None:
        """Each round of the spare keeper while the job trains: a standby whose host became
        unfit (a GPU fell off, drained, down, taken) or that is no spare any more is stopped
        and one is readied on the first fit spare; a job without one gets one once a spare is
        fit (healthy again, or a new spare). A standby that is fine stays where it is (no move
        back when a spare ahead of it is healthy again), and a spare the last try failed on is
        not tried every round. Nothing is done during an incident or while a standby starts."""
        job = self._live
        if not self._keeping or job.incident is not None:
            return
        if job.state is not JobState.RUNNING:
            return
        if self._warm_task is not None and not self._warm_task.done():
            return
        current = self.warm
        if current is not None:
            if current.host in job.spares and self._usable(current):
                return
        else:
            spare = self._first_fit_spare()
            if spare is None or spare == self._warm_on:
                return
        self.keep_warm()

    async def cancel_warm(self) -> None:
        """The readying of a standby is called off (its supervision ends): a task of this job
        never outlives it (one did, and wrote to the journal its console had closed). A
        standby already ready is left to its idle exit, as every executor is left running."""
        task, self._warm_task = self._warm_task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def drop_warm(self) -> None:
        await self.cancel_warm()
        warm, self.warm = self.warm, None
        if warm is not None:
            await self.discard(warm)
