"""The executors a job's next epoch starts on (a group's; one host's is a group of one), kept
ready while it recovers.

Survivors whose run ended wait, warm (torch imported), for the next epoch's Start, kept under
lease meanwhile; while a lost member's lease runs out, an idle executor is readied on the host
that would replace it. The next epoch takes these, and starts (deploys) only what is missing.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from console import clock
from console.fleet.hosts import Fleet
from console.fleet.link import ExecutorLink, LinkError
from console.records.journal import Journal, Kind
from console.supervise.group.member_events import send_quietly
from console.supervise.launcher import Launcher
from console.supervise.lease import JobLease, NoAnchor
from console.supervise.live import LiveJob
from console.supervise.member import Member
from console.supervise.outcome import WAITING, Exit, Outcome
from console.supervise.policy import Decision, Policy, decide
from console.supervise.standby import Standby
from console.supervise.twin import Twin
from console.supervise.unless_down import HostLost, given_up, unless_down
from protocol.faults import StopReason
from protocol.messages import ExecutorState, Stop


class WarmExecutors:
    """Warm survivors and readied replacements, and the executor each member's next start takes."""

    def __init__(
        self,
        live: LiveJob,
        *,
        launcher: Launcher,
        lease: JobLease,
        fleet: Fleet,
        journal: Journal,
        policy: Callable[[], Policy],
        members: Callable[[], list[str]],
        wait_gone: Callable[[str], Awaitable[bool | None]],
        standby: Standby,
        twin: Twin,
    ) -> None:
        self._live = live
        self._name = live.name
        self._launcher = launcher
        self._lease = lease
        self._fleet = fleet
        self._journal = journal
        self._policy = policy
        self._members = members
        """The job's hosts now, by node rank."""
        self._wait_gone = wait_gone
        """Until no executor of the job holds its workdir on the host (``Probe.wait_gone``)."""
        self._standby = standby
        """The job's warm standby on its first spare, if it keeps one (``warm_standby``)."""
        self._twin = twin
        """The warm twin beside a group of one's executor (``warm_twin``: a job on one host):
        a restart in place after its executor's process is gone starts the next epoch in it."""
        self.exiting: set[str] = set()
        """Hosts whose executor stopped at the end of the last epoch (a planned stop, a
        finish) and may still be on its way out, holding the workdir a new one needs."""
        self.warm: set[str] = set()
        """Hosts whose executor's run ended and that waits, alive, for the next epoch's Start:
        kept under lease while the group recovers."""
        self._keeping: asyncio.Task[None] | None = None
        self._calling_off: asyncio.Task[None] | None = None
        """Readied executors being stopped in the background (``call_off``)."""
        self.readied: dict[str, asyncio.Task[ExecutorLink | Outcome]] = {}
        """Idle executors started on replacement hosts while a lost member's lease runs out
        (torch imported, waiting for Start): host -> its start."""

    # ------------------------------------------------------------ readied

    def ready_hosts(self) -> list[str]:
        """Hosts with an idle executor ready for the job, or coming up: readied replacements,
        and the warm standby's spare (a recovery's first choices)."""
        warm = self._standby.warm
        on = warm.host if warm is not None else self._standby.starting_on()
        return [*self.readied, *([on] if on is not None else [])]

    def ready_replacement(self, m: Member) -> None:
        """``m``'s host cannot be asked: start an idle executor on the host that would replace
        it, so a replacement decided when the lease ends needs no process start then. A warm
        standby is that executor already (a second started on its spare's workdir would be
        refused)."""
        if self.ready_hosts() or decide(self._policy(), failover=True) is not Decision.ACT:
            return
        usable = self._fleet.usable(exclude=set(self._members()))
        spares = [s for s in self._live.spares if s in usable]
        target = next(iter(spares), None)
        if target is None:
            return
        self._journal.record(
            Kind.EXECUTOR,
            f"{self._name}: {m.host} cannot be reached; readying an executor on {target} "
            "while its lease runs out",
            job=self._name,
            host=target,
        )
        self._fleet.hosts[target].job = self._name  # no other job's failover takes it meanwhile
        self.readied[target] = asyncio.create_task(self._readied_on(target))

    async def _readied_on(self, target: str) -> ExecutorLink | Outcome:
        """An idle executor started on ``target``, given up (HostLost) once the fleet finds
        the host down: a frozen target would hold the next epoch up for the start's timeouts."""
        try:
            return await unless_down(
                self._fleet,
                target,
                self._launcher.start(target, released=lambda _h: None),
            )
        except HostLost:
            given_up(self._journal, self._name, target)
            raise

    def call_off(self, why: str) -> None:
        """The readied executors are not needed (the member they were for answers again):
        stopped in the background, so the caller goes on reading its links meanwhile; the
        next ``drop_readied`` waits for it."""
        if self.readied and (self._calling_off is None or self._calling_off.done()):
            self._calling_off = asyncio.create_task(self.drop_readied([], why=why))

    async def drop_readied(self, keep: list[str], why: str = "") -> None:
        """Readied executors on hosts the next epoch does not use are stopped (``why``: said
        in the journal, where it is not the next epoch that leaves them out)."""
        calling_off, self._calling_off = self._calling_off, None
        if calling_off is not None and calling_off is not asyncio.current_task():
            await asyncio.gather(calling_off, return_exceptions=True)
        for host in [h for h in self.readied if h not in keep]:
            task = self.readied.pop(host)
            if host not in self._members():  # free for other jobs (a workdir is its job's own)
                self._fleet.free(host, self._name, f"{self._name} readied it for nothing")
            if why:
                self._journal.record(
                    Kind.EXECUTOR,
                    f"{self._name}: the executor readied on {host} is not needed: {why}",
                    job=self._name,
                    host=host,
                )
            if not task.done():
                task.cancel()  # the launcher stops an executor whose start was cancelled
                await asyncio.gather(task, return_exceptions=True)
                continue
            got = None if task.cancelled() or task.exception() else task.result()
            if isinstance(got, ExecutorLink):
                await send_quietly(got, Stop(reason=StopReason.NOT_NEEDED, checkpoint=False))
                await got.finish()

    async def fresh(self, host: str, link: ExecutorLink | Outcome) -> ExecutorLink | Outcome:
        """``link`` (or why there is none), or a new link to the same idle executor when its newest clock reading is
        older than a third of a lease: a first lease is anchored to that reading, and one taken
        while the slowest member of the group still started would reach its executor nearly
        spent (chaos: the member started first got a lease already over at Start and died,
        and a whole epoch with it)."""
        if isinstance(link, Outcome):
            return link
        anchor = link.anchor
        if anchor is not None and clock.mono() - anchor[1] <= self._lease.ttl_s / 3:
            return link
        link.close()
        again = self._launcher.relink(link)
        try:
            hello = await again.open(timeout=5)
        except LinkError as e:
            return Outcome(Exit.CRASHED, f"the idle executor on {host} went away: {e}")
        if hello.state not in (
            ExecutorState.IDLE,
            ExecutorState.FAULTED,
        ):  # faulted: a survivor waiting, warm
            again.close()
            return Outcome(Exit.CRASHED, f"the executor on {host} is {hello.state}, not waiting")
        return again

    async def executor(self, host: str) -> ExecutorLink | Outcome:
        """The executor that will run this member: the warm standby on its host, a warm one
        (its run ended, it waits), one readied while a lost member's lease ran out, else one
        started (deployed first)."""
        standby = await self._standby.take_warm(host)
        if standby is not None:
            self._journal.record(
                Kind.EXECUTOR,
                f"{self._name}: the warm standby on {host} takes the member's rank",
                job=self._name,
                host=host,
                data={"standby": True},
            )
            link = await self._relinked_idle(host, standby.link)
            if link is not None:
                return link
        readied = self.readied.pop(host, None)
        if readied is not None:
            try:
                got = await readied
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise  # this launch is cancelled (the console quits), not the readied start
                got = None
            except HostLost as e:  # its rank is placed anew, on another host
                return Outcome(Exit.HOST_LOST, str(e))
            if isinstance(got, ExecutorLink):
                link = await self._relinked_idle(host, got)
                if link is not None:
                    return link
        if host in self.warm:
            self.warm.discard(host)
            link = self._launcher.link(host)
            with contextlib.suppress(LinkError):
                hello = await link.open(timeout=5)
                if hello.state == ExecutorState.FAULTED:
                    return link
            link.close()
        if host in self.exiting:
            self.exiting.discard(host)
            await self._wait_gone(host)
        twin = self._twin.take(host)  # it refuses a Start while an executor holds the workdir
        if twin is not None and (link := await self._relinked_idle(host, twin)) is not None:
            return link
        return await self._launcher.start(host, released=lambda _h: None)

    async def _relinked_idle(self, host: str, readied: ExecutorLink) -> ExecutorLink | None:
        """A fresh link to a readied idle executor: its Hello is a current clock reading to
        anchor the first lease to (the readied link's is as old as the wait); None when it is
        gone or no longer idle."""
        readied.close()
        link = self._launcher.relink(readied)  # its socket: the job's, or its twin's
        with contextlib.suppress(LinkError):
            if (await link.open(timeout=5)).state == ExecutorState.IDLE:
                return link
        link.close()
        return None

    # ------------------------------------------------------------ warm survivors

    async def keep_survivors_warm(self, members: list[Member]) -> None:
        """Survivors whose run ended wait, warm, for the next Start: each is asked at once (all
        together) and, waiting, renewed then and kept under lease while the group recovers,
        whatever else it waits for meanwhile (the dead member's checkpoint read back, a
        replacement's start)."""
        for m in members:
            if m.exit is not None and m.exit.exit in (Exit.PLANNED, Exit.STOPPED, Exit.FINISHED):
                self.exiting.add(m.host)
        asking = [
            m.host
            for m in members
            if m.exit is not None and m.exit.exit in WAITING and m.host not in self.warm
        ]
        epoch = self._live.epoch
        waiting = await asyncio.gather(*(self._renew(h, epoch) for h in asking))
        self.warm.update(h for h, yes in zip(asking, waiting, strict=True) if yes)
        if self.warm and self._keeping is None:
            self._keeping = asyncio.create_task(self._keep(epoch))

    async def _keep(self, epoch: int) -> None:
        """Every warm host renewed together, each round: one slow to answer holds no other
        back (one at a time, two survivors under a starved console went 5 s unrenewed on a
        3 s lease, and were started afresh)."""
        while True:
            await asyncio.sleep(self._lease.ttl_s / 3)  # as often as any lease is renewed
            hosts = list(self.warm)
            waiting = await asyncio.gather(*(self._renew(h, epoch) for h in hosts))
            self.warm.difference_update(h for h, yes in zip(hosts, waiting, strict=True) if not yes)

    async def _renew(self, host: str, epoch: int) -> bool:
        """A renewal for the executor on ``host`` if it waits, warm, after ``epoch``: over a
        fresh link, whose Hello is the clock reading the renewal is anchored to. False when it
        does not wait (gone, or another epoch's)."""
        link = self._launcher.link(host)
        try:
            hello = await link.open(timeout=min(2.0, self._lease.ttl_s / 3))
            if hello.state != ExecutorState.FAULTED or hello.epoch != epoch:
                return False
            with contextlib.suppress(NoAnchor):  # not granted now (its bound not on disk)
                await link.send(self._lease.renewal(link, host, epoch))
            return True
        except LinkError:
            return False
        finally:
            link.close()

    async def take(self, plan: list[str]) -> list[ExecutorLink | Outcome]:
        """Each of ``plan``'s executor (``executor``), warm survivors' last: they are kept under
        lease until every other member's is got (a replacement readied late, under load,
        started cold past a lease after the survivors' keeping had stopped)."""
        later = [h for h in plan if h in self.warm]
        first = [h for h in plan if h not in later]
        got = dict(zip(first, await asyncio.gather(*map(self.executor, first)), strict=True))
        await self.stop_keeping()
        got.update(zip(later, await asyncio.gather(*map(self.executor, later)), strict=True))
        return [got[h] for h in plan]

    async def stop_keeping(self) -> None:
        task, self._keeping = self._keeping, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
