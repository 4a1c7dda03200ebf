"""What a host says about a job's executor when its link cannot: is it alive (its workdir's
lock held), how did it end (its events.jsonl), and ending a hung one by the lock's pid.
"""

from __future__ import annotations

import asyncio
import errno
import posixpath
import time
from collections.abc import Callable
from dataclasses import dataclass

from console.fleet import starvation
from console.inventory import Inventory
from console.reach.deploy import job_dir
from console.reach.remote import KillStatus, executor_alive, kill_executor
from console.reach.transport.base import PermanentTransportError, Transport, TransportError
from console.records.journal import Journal, Kind
from console.supervise.launcher import START_TIMEOUT_S
from console.supervise.live import Alert
from console.supervise.outcome import Exit, Outcome, from_events_tail

POLL_S = 0.2
REAP_BUDGET_S = 10.0
"""How long a move waits on the old host's reaping before the lease bound and fence cover it."""
TAIL_BYTES = 64 * 1024
TRANSPORT_SLACK_S = 1.0
REFUSALS = frozenset({errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH, errno.ECONNRESET})
"""Errors a host (or the network on its way) answered with: a refusal is an answer."""


@dataclass(frozen=True)
class Answer:
    """What a probe of a job's executor found."""

    alive: bool | None
    """True: an executor holds the workdir's lock; False: none does; None: not answered."""
    known: bool
    """Whether it may be acted on: an answer, a refusal, or silence while the console was
    healthy. False: the probe was starved (of the console's loop or of CPU), an unknown."""
    why: str = ""


@dataclass
class Asking:
    """One loss's asks of one host (single-host and group alike): how long the next ask gets."""

    full_s: float
    """What an ask gets when it must not be cut short."""
    probed: bool = False
    answered: bool = False
    """Whether the host said an executor is alive in this loss."""

    def cut(self, silent: bool, budget: float) -> float:
        """The first ask of a loss gets its full time, whatever is left of the lease (a loaded
        host slow to start Python is not one that cannot be asked, nor is a link just healed),
        and so does every ask of a host that answered alive in it (one short ask missed at the
        lease's end is not a lost host); the others, near the lease's end, what is left of it."""
        return budget if silent and self.probed and not self.answered else self.full_s

    def heard(self, answer: Answer) -> None:
        self.probed = True
        self.answered = self.answered or answer.alive is True

    def afresh(self) -> None:
        """The console found itself cut off from every host: what it heard then says nothing
        of this host, and the next ask is a first one."""
        self.probed = self.answered = False


class Probe:
    def __init__(
        self,
        job: str,
        *,
        inv: Inventory,
        transport: Callable[[str], Transport],
        journal: Journal,
        alert: Alert,
    ) -> None:
        self.job = job
        self._inv = inv
        self._transport = transport
        self._journal = journal
        self._alert = alert
        self._fair: dict[str, float] = {}
        """Per host whose last probe was starved, the budget its next one gets at least."""

    def workdir(self, host: str) -> str:
        return job_dir(self._inv.host_root(host), self.job)

    async def alive(self, host: str, workdir: str, budget: float) -> bool | None:
        """Is the executor alive (lock held)? None when the host cannot be asked within
        ``budget``, for whatever reason (``ask`` says which reasons count)."""
        return (await self.ask(host, workdir, budget)).alive

    async def ask(self, host: str, workdir: str, budget: float) -> Answer:
        """Is the executor alive (lock held), and may that be acted on?

        An answer counts, and so does a refusal (refused, unreachable, not allowed); a probe
        that timed out or lost its connection counts only if the console and its machine were
        healthy over its window (``starvation``). One that did not is an unknown, and the next
        probe of this host gets a budget this machine can meet.
        """
        budget = max(budget, self.fair_budget(host))
        began = time.monotonic()
        try:
            async with asyncio.timeout(budget):
                alive = await executor_alive(
                    self._transport(host),
                    self._inv.python(host),
                    workdir,
                    timeout=budget + TRANSPORT_SLACK_S,  # the budget's own timeout goes first
                )
        except TransportError as e:
            if isinstance(e, PermanentTransportError) or e.errno in REFUSALS:
                return self._known(host, Answer(None, True, str(e)))
            why = str(e)
        except TimeoutError:
            why = f"{host}: no answer within {budget:.2f} s"
        else:
            return self._known(host, Answer(alive, True))
        starved = await starvation.starved(began, budget)
        if starved is None:
            return self._known(host, Answer(None, True, why))
        if host not in self._fair:
            self._journal.record(
                Kind.EXECUTOR,
                f"{self.job}: a probe of {host} did not complete, {starved}: not taken for an "
                "unreachable host; asking again",
                job=self.job,
                host=host,
                data={"stall_s": starved.stall_s, "start_s": starved.start_s, "budget_s": budget},
            )
        cap = self._inv.console.command_timeout_s
        self._fair[host] = min(cap, max(starved.fair_s, 2 * budget))
        return Answer(None, False, f"{why}; {starved}")

    def fair_budget(self, host: str) -> float:
        """The least a probe of ``host`` gets now: more than 0 after a starved one."""
        return self._fair.get(host, 0.0)

    def _known(self, host: str, answer: Answer) -> Answer:
        self._fair.pop(host, None)
        return answer

    async def wait_gone(self, host: str, probe_s: float = 3.0) -> bool | None:
        """Until no executor holds this job's lock on ``host`` (one may still be exiting).

        True once seen gone; False if one still held it at the deadline; None if the host
        could not be asked (unreachable is not gone).
        """
        workdir = self.workdir(host)
        deadline = time.monotonic() + START_TIMEOUT_S / 6
        while time.monotonic() < deadline:
            alive = await self.alive(host, workdir, probe_s)
            if alive is None:
                return None
            if alive is False:
                return True
            await asyncio.sleep(POLL_S)
        return False

    async def hung(self, host: str, workdir: str) -> Outcome:
        """A silent executor still holding its lock past the lease: killed, a hang. Unless
        nothing held the lock by the time of the kill: it ended on its own meanwhile (a member
        whose link broke as it finished, still exiting when probed), and its events say how."""
        if await self.kill(host, workdir) is KillStatus.NOT_HELD:
            return await self.ended(host)
        return Outcome(Exit.HUNG, f"executor on {host} stopped answering")

    async def kill(self, host: str, workdir: str) -> KillStatus | None:
        """End a hung executor by the pid that holds its workdir's lock, never by a name pattern
        (one would match another job's executor whose workdir shares a prefix); the outcome is
        journaled, and a kill that did not happen is an alert. None: the host was not asked."""
        try:
            result = await kill_executor(self._transport(host), self._inv.python(host), workdir)
        except TransportError as e:
            self._alert(
                f"{self.job}: could not kill the hung executor on {host}: {e}",
                job=self.job,
                host=host,
            )
            return None
        self._journal.record(
            Kind.EXECUTOR,
            f"{self.job}: killing the hung executor on {host}: {result.why}",
            job=self.job,
            host=host,
            data={
                "kill": result.status.name.lower(),
                "pid": result.pid,
                "holders": result.holders,
                "reaped": result.reaped,
            },
        )
        if result.status not in (KillStatus.KILLED, KillStatus.NOT_HELD):
            self._alert(
                f"{self.job}: the hung executor on {host} was not killed cleanly: {result.why}",
                job=self.job,
                host=host,
            )
        return result.status

    async def reap(self, host: str) -> bool:
        """Before a job moves off a host the console can reach: whatever is left there of its
        run (an executor still exiting, the run's cgroup, the processes carrying its token) is
        killed and seen gone. True when it was; False (journaled, an alert) when the host did
        not answer or something outlived SIGKILL: then the lease bound and the host's fence
        are what keep the old run from training beside the next."""
        workdir = self.workdir(host)
        try:
            async with asyncio.timeout(REAP_BUDGET_S):
                result = await kill_executor(
                    self._transport(host), self._inv.python(host), workdir, timeout=5
                )
        except (TransportError, TimeoutError) as e:
            self._journal.record(
                Kind.EXECUTOR,
                f"{self.job}: could not reap the old run on {host} before moving: "
                f"{e or 'no answer in time'}",
                job=self.job,
                host=host,
                data={"reap": "unanswered"},
            )
            return False
        clean = result.status in (KillStatus.KILLED, KillStatus.NOT_HELD)
        if result.reaped or result.status is KillStatus.KILLED or not clean:
            self._journal.record(
                Kind.EXECUTOR,
                f"{self.job}: reaped the old run on {host} before moving: {result.why}"
                f" ({result.reaped} process(es) of its command)",
                job=self.job,
                host=host,
                data={"reap": result.status.name.lower(), "reaped": result.reaped},
            )
        if not clean:
            self._alert(
                f"{self.job}: the old run on {host} was not reaped cleanly: {result.why}",
                job=self.job,
                host=host,
            )
        return clean

    async def ended(self, host: str) -> Outcome:
        """The executor is gone: how did it end? Its events.jsonl says."""
        t = self._transport(host)
        path = posixpath.join(self.workdir(host), "events.jsonl")
        try:
            st = await t.stat(path)
            chunks = [
                c
                async for c in t.read_chunks(
                    path, offset=max(0, (st.size if st else 0) - TAIL_BYTES)
                )
            ]
        except TransportError:
            return Outcome(Exit.CRASHED, "the executor is gone and its events cannot be read")
        return from_events_tail(b"".join(chunks).decode(errors="replace"))
