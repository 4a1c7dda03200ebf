"""The hosts as the console sees them: state machine, transport, health series, findings."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from console.fleet.health_rules import Finding, Severity, evaluate
from console.inventory import Inventory
from console.reach.transport.base import Transport, TransportError
from console.reach.transport.factory import open_transport
from console.records.journal import Journal, Kind
from console.records.state_store import StateStore
from console.states import HOST_TRANSITIONS, HostState, Machine
from protocol.messages import Health

PROBE_TIMEOUT_S = 3.0
HEARD_RECENTLY_S = 1.0
"""A host heard from this recently shows the console is online without a probe."""
HEALTH_KEPT = 2
STALE_AFTER_SAMPLES = 2
"""A sample older than this many of its source's intervals is old: the views show its age,
never its numbers as current."""
PROBE_RULE = "probe"
"""The finding of a health probe that gave no sample."""
HISTORY_LEN = 120
"""Samples of the utilisation and CPU history kept per host, as plain numbers: a thousand hosts'
whole Health objects would be millions of objects for the garbage collector to walk."""


def mean_gpu_util(h: Health) -> float | None:
    vals = [g.util_pct for g in h.gpus if g.util_pct is not None]
    return sum(vals) / len(vals) if vals else None


@dataclass
class HostRuntime:
    name: str
    transport: Transport
    machine: Machine[HostState]
    health: deque[Health] = field(default_factory=lambda: deque(maxlen=HEALTH_KEPT))
    """The newest samples whole (the rules compare the last two)."""
    util_history: deque[float | None] = field(default_factory=lambda: deque(maxlen=HISTORY_LEN))
    """Mean GPU utilisation per sample (None: no GPU figure), oldest first."""
    cpu_history: deque[float] = field(default_factory=lambda: deque(maxlen=HISTORY_LEN))
    samples: int = 0
    """Health samples seen in all."""
    findings: list[Finding] = field(default_factory=list)
    last_seen: float = 0.0
    """Monotonic time of the last heartbeat or successful probe."""
    heard_every_s: float = 1.0
    """How often the host is expected to be heard from: its executor's heartbeat, or the
    reachability probe's interval for a host with none (what ``seen`` is judged against)."""
    sampled_at: float = 0.0
    """Monotonic time the newest Health sample arrived (0.0: none yet). A sample has an age:
    the views show an old one as old (``console/ui/view.py``, ``STALE_AFTER_SAMPLES``)."""
    sample_every_s: float = 1.0
    """How often the newest sample's source samples (an executor: every heartbeat; the health
    probe of a host with no executor: ``health_probe_s``): what its age is measured against."""
    job: str | None = None
    """The job running here as its primary, if any."""
    releasing: bool = False
    """A provisioned host chosen for release (its release command may be running): out of use
    for good from that moment, a cordon stronger than an operator's (no restart in place)."""
    released: bool = False
    """A provisioned host given back (its release command ran): never probed or used again."""

    @property
    def state(self) -> HostState:
        return self.machine.state

    @property
    def leaving(self) -> bool:
        """Being released or released: no job goes there, none restarts there, no spare."""
        return self.releasing or self.released

    def sample_age(self, now: float) -> float | None:
        """Seconds since the newest sample arrived; None: no sample yet."""
        return now - self.sampled_at if self.sampled_at else None

    def sample_stale(self, now: float) -> bool:
        """Is the newest sample too old to show as current (``STALE_AFTER_SAMPLES`` intervals)?"""
        age = self.sample_age(now)
        return age is not None and age > STALE_AFTER_SAMPLES * self.sample_every_s


class Fleet:
    def __init__(self, inv: Inventory, journal: Journal, store: StateStore) -> None:
        self.inv = inv
        self.journal = journal
        self.store = store
        self.hosts: dict[str, HostRuntime] = {}
        self.readying: set[str] = set()
        """Hosts a recovery readies (a copy there, an executor started there) before any
        executor of a job reports from them: the reachability check watches them as it
        watches idle hosts, so a host that dies meanwhile is found down."""
        self.changed = asyncio.Event()
        """Set whenever a host may have become usable (added, revived, uncordoned)."""
        for name in inv.hosts:
            self.add(name)

    def add(self, name: str) -> HostRuntime:
        rec = self.store.host(name)
        initial = (
            HostState.CORDONED
            if rec.cordoned
            else HostState.DRAINED
            if rec.drained
            else self._draining(name)
            if rec.draining
            else HostState.UP
        )
        rt = HostRuntime(name, open_transport(self.inv, name), Machine(initial, HOST_TRANSITIONS))
        rt.releasing = rec.releasing
        self.hosts[name] = rt
        self.changed.set()
        return rt

    def _draining(self, name: str) -> HostState:
        """A drain found in flight at console start: draining while a job that is not over
        still names the host (its move is made), drained once none does (it was made)."""
        moving = any(
            name == rec.host or name in rec.members
            for rec in self.store.state.jobs.values()
            if not rec.finished and not rec.stopped
        )
        return HostState.DRAINING if moving else HostState.DRAINED

    def set_state(self, name: str, state: HostState, why: str) -> None:
        rt = self.hosts[name]
        before = rt.state
        if rt.machine.can(state) and rt.machine.move(state):
            self.journal.record(
                Kind.HOST_STATE,
                f"{name}: {before.value} -> {state.value} ({why})",
                host=name,
                data={"from": before.value, "to": state.value, "why": why},
            )
            rec = self.store.host(name)
            rec.cordoned, rec.drained = state is HostState.CORDONED, state is HostState.DRAINED
            rec.draining = state is HostState.DRAINING
            self.store.save()
            if state is HostState.UP:
                self.changed.set()

    def free(self, name: str, job: str, why: str) -> None:
        """``job`` no longer holds ``name`` (it left it, readied it for nothing, or ended): the
        host is free for others, and a drain waiting for it is done (draining -> drained).
        The one place a drain ends while jobs run (an operator's drain of a host no job holds
        ends at once): a job that crashed during its drain, or came up on the host after it
        was drained, once left the host draining for good, and ``undrain`` refused it."""
        rt = self.hosts[name]
        if rt.job != job:
            return  # not this job's to free: another holds it, or none did
        rt.job = None
        if rt.state is HostState.DRAINING:
            self.set_state(name, HostState.DRAINED, why)

    def fit(self, name: str) -> bool:
        """Up, failing no health rule or health probe, and not being released: a host a job
        may go to (a spare found broken is not where a job should fail over to)."""
        rt = self.hosts[name]
        return rt.state is HostState.UP and not rt.leaving and not self.failing(name)

    def usable(self, *, exclude: set[str] | None = None) -> set[str]:
        """Hosts that may take a job or serve as a spare: fit and free."""
        return {
            n
            for n, rt in self.hosts.items()
            if rt.job is None and n not in (exclude or set()) and self.fit(n)
        }

    def seen(self, name: str) -> None:
        """A heartbeat from the host's executor."""
        rt = self.hosts[name]
        rt.last_seen = time.monotonic()
        rt.heard_every_s = self.inv.console.heartbeat_s
        if rt.state in (HostState.SUSPECT, HostState.DOWN):
            self.set_state(name, HostState.UP, "heard from again")

    def observe(
        self,
        name: str,
        health: Health,
        *,
        every_s: float | None = None,
        extra: Sequence[Finding] = (),
    ) -> list[Finding]:
        """Feed a Health sample; returns the findings that are new since the last sample.

        ``every_s``: how often its source samples (default: the executors' heartbeat).
        ``extra``: findings about the host its source made beside the sample (the health
        probe's: too little disk, GPUs missing), kept with the rules' until the next sample.
        """
        rt = self.hosts[name]
        previous = rt.health[-1] if rt.health else None
        rt.health.append(health)
        rt.sampled_at = time.monotonic()
        rt.sample_every_s = self.inv.console.heartbeat_s if every_s is None else every_s
        rt.util_history.append(mean_gpu_util(health))
        rt.cpu_history.append(health.cpu_pct)
        rt.samples += 1
        return self._replace_findings(
            name, [*evaluate(health, previous, self.inv.console.health), *extra]
        )

    def probe_failed(self, name: str, why: str) -> list[Finding]:
        """The health probe gave no sample: a FAIL finding (rule ``probe``) until one arrives."""
        rt = self.hosts[name]
        kept = [f for f in rt.findings if f.rule != PROBE_RULE]
        return self._replace_findings(name, [*kept, Finding(Severity.FAIL, PROBE_RULE, why)])

    def _replace_findings(self, name: str, findings: list[Finding]) -> list[Finding]:
        """The host's findings are now these; the new ones are journalled and returned, and a
        host that was failing and is no longer is journalled healthy again, whichever source
        saw it (the health probe, a standby's or a job's executor: a standby's sample that
        cleared a spare's FAIL left no such line, run C)."""
        rt = self.hosts[name]
        was_failing = bool(self.failing(name))
        old = {(f.rule, f.message) for f in rt.findings}
        rt.findings = findings
        fresh = [f for f in findings if (f.rule, f.message) not in old]
        for f in fresh:
            self.journal.record(
                Kind.HEALTH,
                f"{name}: {f.severity.value.upper()} {f.message}",
                host=name,
                data={"severity": f.severity.value, "rule": f.rule},
            )
        if was_failing and not self.failing(name):
            self.journal.record(
                Kind.HEALTH,
                f"{name}: healthy again",
                host=name,
                data={"severity": "ok", "rule": "healthy"},
            )
            self.changed.set()  # a job waiting for a host may take this one
        return fresh

    def failing(self, name: str) -> list[Finding]:
        return [f for f in self.hosts[name].findings if f.severity is Severity.FAIL]

    async def probe(
        self, name: str, timeout: float = PROBE_TIMEOUT_S, every_s: float | None = None
    ) -> bool:
        """Can the console run a command there now? ``every_s``: the prober's interval, when it
        probes the host regularly (then it is what the host is expected to be heard at)."""
        t = self.hosts[name].transport
        try:
            async with asyncio.timeout(timeout):
                await t.connect()
                ok = (await t.run(["true"], timeout=timeout)).returncode == 0
        except (TransportError, TimeoutError, OSError):
            return False
        if ok:
            rt = self.hosts[name]
            rt.last_seen = time.monotonic()
            if every_s is not None:
                rt.heard_every_s = every_s
        return ok

    async def console_online(self, excluding: str) -> bool:
        """Before declaring a host down: can the console still reach any other host? One heard
        from (a heartbeat, a probe) within ``HEARD_RECENTLY_S`` answers at once; else each is
        probed, those marked down too: a console whose own network is out sees every host go
        down, and must not take the last one for lost (with none other, it cannot tell)."""
        others = [n for n in self.hosts if n != excluding]
        if not others:
            return True
        now = time.monotonic()
        if any(now - self.hosts[n].last_seen <= HEARD_RECENTLY_S for n in others):
            return True
        results = await asyncio.gather(*(self.probe(n) for n in others))
        return any(results)

    def releasing(self, name: str) -> None:
        """A provisioned host is chosen for release, before its release command runs: out of
        use for good (persisted, so a console started meanwhile keeps it out) and cordoned
        where its state allows (a down or suspect one stays so, and is left out all the same)."""
        rt = self.hosts[name]
        rt.releasing = True
        self.store.host(name).releasing = True
        self.store.save()
        if rt.state is not HostState.CORDONED:
            self.set_state(name, HostState.CORDONED, "releasing (provisioned, idle)")

    def release(self, name: str) -> None:
        """A provisioned host was given back: cordoned, never probed or chosen again."""
        rt = self.hosts[name]
        rt.released = True
        self.set_state(name, HostState.CORDONED, "released (provisioned, idle)")

    async def close(self) -> None:
        for rt in self.hosts.values():
            try:
                await rt.transport.close()
            except TransportError:
                pass
