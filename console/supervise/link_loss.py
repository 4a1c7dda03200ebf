"""What a lost link to a job's executor means: one classifier for every job, a single host's
and each member of a group alike.

A link dropped is relinked if the loss was a blip (the same executor, same epoch, still
training: it answers again). Otherwise the host is asked whether an executor still holds the
job's workdir: none does (it ended: read how), one does (a hang, killed once its lease ran out),
or the host cannot be asked (lost, once its lease ran out: it may still be training under the
lease it holds). Nothing is decided before the lease has surely ended, and only on an answer
that may be acted on (a probe starved of CPU is an unknown); a console cut off from every host
decides nothing and, back online, asks again.

What the loss means for the job (its state, its incident, a target readied, a warm executor
kept) is the job's: the classifier tells it through ``Side``. Example sequences:

- ``link closed -> relinked at once -> answered`` (a blip: nothing opened)
- ``link closed -> silent -> host asked: cannot be -> unreachable (target readied) -> lease
  ended -> lost('host_lost') -> HOST_LOST``
- ``link closed -> silent -> host asked: executor holds the lock -> lease ended ->
  lost('executor_hang') -> killed -> HUNG``
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Protocol

from console.fleet.detect import DetectionSettings, is_suspect
from console.fleet.link import ExecutorLink, LinkError
from console.states import HostState
from console.supervise.live import Alert
from console.supervise.outcome import Exit, Outcome
from console.supervise.probe import Answer, Asking
from protocol.messages import ExecutorState

POLL_S = 0.2
PROBE_MIN_S = 3.0
"""What a host's first ask of a loss gets (``Asking``): a loaded host may take over 2 s to start
the probe's Python (three executors of a group on one 2-core machine), and an ask timed out on
a healthy console reads as a host that cannot be asked."""
LIVE = (ExecutorState.TRAINING, ExecutorState.STOPPING)
"""An executor in these states at the job's epoch is the one the link was to, still running."""


class Asker(Protocol):
    """Asking a host about the job's executor (``console/supervise/probe.Probe``)."""

    def workdir(self, host: str) -> str: ...
    async def ask(self, host: str, workdir: str, budget: float) -> Answer: ...
    def fair_budget(self, host: str) -> float: ...
    async def hung(self, host: str, workdir: str) -> Outcome: ...
    async def ended(self, host: str) -> Outcome: ...


class Hosts(Protocol):
    """The fleet, as far as a loss concerns it (``console/fleet/hosts.Fleet``)."""

    def set_state(self, name: str, state: HostState, why: str) -> None: ...
    async def console_online(self, excluding: str) -> bool: ...


class Side(Protocol):
    """The job's end of one lost link: what the classifier reads of it and tells it."""

    @property
    def epoch(self) -> int:
        """The epoch the link's executor trains."""
        ...

    def last_seen(self) -> float:
        """When the executor was last heard from (monotonic)."""
        ...

    def left(self) -> float:
        """Seconds until the newest lease granted to it has surely ended (<= 0: ended)."""
        ...

    async def answered(self, link: ExecutorLink) -> None:
        """The same executor answers again on ``link`` (a blip): linked and granted a lease."""
        ...

    def faulted(self, link: ExecutorLink) -> Outcome:
        """The same executor answers, its run ended while unlinked: how the run ended."""
        ...

    def silent(self) -> None:
        """Seen silent for the first time in this loss (the host is marked suspect)."""
        ...

    def unreachable(self) -> None:
        """The host cannot be asked: a target may be readied while the lease runs out."""
        ...

    def lost(self, fault_class: str) -> None:
        """The loss is decided (its lease ended): ``host_lost`` or ``executor_hang``."""
        ...


class LinkLoss:
    """Classifies a lost link to one of a job's executors (see the module's docstring)."""

    def __init__(
        self,
        job: str,
        *,
        hosts: Hosts,
        probe: Asker,
        detection: DetectionSettings,
        heartbeat_s: float,
        link: Callable[[str], ExecutorLink],
        alert: Alert,
    ) -> None:
        self._job = job
        self._hosts = hosts
        self._probe = probe
        self._detection = detection
        self._probe_s = max(0.5, 2 * heartbeat_s)
        """What an ask gets while the executor is not yet silent (or not near its lease's end)."""
        self._link = link
        """A new, unopened link to the job's executor on a host."""
        self._alert = alert

    async def classify(self, host: str, why: str, side: Side) -> Outcome | None:
        """None: relinked after a blip (``side.answered``); else how the executor's run ended.

        Probes are cut short near the lease's end, so the decision follows the end closely;
        only a probe that may be acted on (``Answer.known``) decides.
        """
        workdir = self._probe.workdir(host)
        silent_noted = offline = known = False
        alive: bool | None = None
        asking = Asking(PROBE_MIN_S)
        while True:
            silent = is_suspect(time.monotonic(), side.last_seen(), self._detection)
            if known and silent and side.left() <= 0:
                if alive:
                    side.lost("executor_hang")
                    return await self._probe.hung(host, workdir)
                if await self._hosts.console_online(excluding=host):
                    if not offline:
                        side.lost("host_lost")
                        return Outcome(Exit.HOST_LOST, f"{host} unreachable past its lease: {why}")
                    # Online again after reaching no host: what was said of this host was said
                    # while the console itself was cut off. Ask it again before calling it lost.
                    offline = known = False
                    alive = None
                    asking.afresh()
                    continue
                if not offline:
                    offline = True
                    self._alert(
                        f"the console reaches no host at all: not failing {self._job} over",
                        job=self._job,
                    )
            budget = max(0.2, min(self._probe_s, side.left())) if silent else self._probe_s
            relinked = await self._relink(host, side, max(budget, self._probe.fair_budget(host)))
            if relinked is not False:
                return None if relinked is True else relinked
            # The probe runs a short Python program on the host, which a loaded host may take a
            # while to start; one cut short reads as "cannot be asked", not as "gone". Only
            # near the lease's end is it cut short, so the decision follows the end closely.
            answer = await self._probe.ask(host, workdir, asking.cut(silent, budget))
            asking.heard(answer)
            if answer.alive is False:
                return await self._probe.ended(host)
            if answer.known:
                known, alive = True, answer.alive
            if silent and not silent_noted:
                silent_noted = True
                self._hosts.set_state(host, HostState.SUSPECT, f"no heartbeat: {why}")
                side.silent()
            if known and alive is None:
                side.unreachable()
            if not (known and silent and side.left() <= 0):  # ended: decide now, not a poll later
                await asyncio.sleep(min(POLL_S, max(side.left(), 0.0)) if silent else POLL_S)

    async def _relink(self, host: str, side: Side, budget: float) -> bool | Outcome:
        """Reconnect to the same executor (same epoch): True if it still runs (a blip); its
        run's end if it ended while unlinked (the executor waits, warm); False otherwise."""
        link = self._link(host)
        try:
            async with asyncio.timeout(budget):
                hello = await link.open(timeout=budget)
        except (LinkError, TimeoutError):
            link.close()
            return False
        if hello.epoch == side.epoch and hello.state in LIVE:
            await side.answered(link)
            return True
        if hello.epoch == side.epoch and hello.state == ExecutorState.FAULTED:
            return side.faulted(link)
        link.close()
        return False
