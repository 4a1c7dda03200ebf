"""Watching the hosts no job runs on: up or down, and fit or not, before a job needs them.

Two loops. Reachability: every ``REACH_EVERY_S`` a host without a running job runs ``true``
(up and down follow; never down on a round the console was too starved to tell, see
``starvation``). Health: every ``health_probe_s`` a host that no executor reports on (a spare,
an idle host, a drained one) gets the light health probe, whose sample goes through
``Fleet.observe`` like an executor's, so the Fleet view shows a spare's numbers and the health
rules judge it. A host that fails a rule or the probe is not chosen as a target
(``Fleet.usable``), and a job whose spares are all unfit or down is an alert.

It is given what it needs (the fleet, the inventory, the journal, an alert callable and a way
to read the jobs' spares), never the controller.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from typing import Protocol

from console.fleet import starvation
from console.fleet.health_rules import Finding, Severity
from console.fleet.hosts import PROBE_TIMEOUT_S, Fleet
from console.inventory import Host, Inventory
from console.reach.health_probe import HealthProbeFailed, NotDeployed, probe_health
from console.records.journal import Journal, Kind
from console.states import HostState
from protocol.messages import Health
from protocol.units import size_mb

REACH_EVERY_S = 2.0
PROBES_AT_ONCE = 16
"""Health probes in flight at once: a thousand idle hosts are probed a few at a time."""


class Alert(Protocol):
    def __call__(self, msg: str, *, job: str | None = None, host: str | None = None) -> None: ...


def probe_findings(h: Health, host: Host, min_free_disk_gb: float) -> list[Finding]:
    """What the health probe judges beside the health rules: would a job fit here?"""
    out: list[Finding] = []
    working = sum(1 for g in h.gpus if not g.lost)
    if host.gpus and working < host.gpus:
        out.append(
            Finding(
                Severity.FAIL,
                "gpus_missing",
                f"expected {host.gpus} GPUs, NVML sees {working} ({h.gpu_status})",
            )
        )
    if h.disk_total_mb and h.disk_free_mb < min_free_disk_gb * 1024:
        out.append(
            Finding(
                Severity.FAIL,
                "disk_min",
                f"only {size_mb(h.disk_free_mb)} free under its root "
                f"(min_free_disk_gb is {min_free_disk_gb:g})",
            )
        )
    return out


class HostMonitor:
    def __init__(
        self,
        fleet: Fleet,
        inv: Inventory,
        journal: Journal,
        *,
        alert: Alert,
        spares: Callable[[], Mapping[str, list[str]]],
        executor_env: Mapping[str, Mapping[str, str]],
        may_deploy: bool = True,
        need_host: Callable[[str], None] = lambda _why: None,
        replaced_within_s: float = 0.0,
    ) -> None:
        self._fleet = fleet
        self._inv = inv
        self._journal = journal
        self._alert = alert
        self._spares = spares
        """The spares of every live job (job -> hosts)."""
        self._env = executor_env
        """Read at each probe: a test's fake GPU for a host reaches the probe too."""
        self._may_deploy = may_deploy
        self._need_host = need_host
        """A job has no healthy spare left: a host is wanted (the provisioner's cue)."""
        self.every_s = inv.console.health_probe_s
        self._probing: dict[str, asyncio.Task[None]] = {}
        self._probed_at: dict[str, float] = {}
        """When each host's last probe started: probes start every ``every_s``."""
        self._ours: dict[str, float] = {}
        """The ``sampled_at`` of each host's newest probe sample (another: an executor's)."""
        self._slots = asyncio.Semaphore(PROBES_AT_ONCE)
        self._short: set[str] = set()
        """Jobs alerted for having no healthy spare, until one is healthy again."""
        self._replaced_within_s = replaced_within_s
        """How long the job's spare keeper may take to replace an unfit spare with a free
        usable host: while it may, a job without a healthy spare is no alert (it fired 4 s
        before the replacement was chosen)."""
        self._unfit_since: dict[str, float] = {}
        """Since when each job has had no healthy spare."""

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._watch_reach(), name="reachability")
            tg.create_task(self._watch_health(), name="health probes")

    # ------------------------------------------------------------ reachability

    async def _watch_reach(self) -> None:
        fleet = self._fleet
        while True:
            now = time.monotonic()
            idle = [  # a host heard from just now (a standby's heartbeat) needs no probe
                n
                for n, rt in list(fleet.hosts.items())
                if (rt.job is None or n in fleet.readying)
                and not rt.released
                and not rt.releasing
                and now - rt.last_seen > REACH_EVERY_S
            ]
            began = time.monotonic()
            results = await asyncio.gather(*(fleet.probe(n, every_s=REACH_EVERY_S) for n in idle))
            starved = None
            if not all(results):  # a probe the console was too starved to run says nothing
                starved = await starvation.starved(began, PROBE_TIMEOUT_S)
            for name, ok in zip(idle, results, strict=True):
                state = fleet.hosts[name].state
                if ok and state is HostState.DOWN:
                    fleet.set_state(name, HostState.UP, "reachable again")
                    self._probed_at.pop(name, None)  # its health is news too: probe it now
                elif not ok and starved is None and state in (HostState.UP, HostState.SUSPECT):
                    fleet.set_state(name, HostState.DOWN, "unreachable")
            self.check_spares()
            await asyncio.sleep(REACH_EVERY_S)

    # ------------------------------------------------------------------ health

    async def _watch_health(self) -> None:
        try:
            while True:
                for name in self.due(time.monotonic()):
                    self._probed_at[name] = time.monotonic()
                    self._probing[name] = asyncio.create_task(
                        self.probe(name), name=f"health probe {name}"
                    )
                await asyncio.sleep(min(self.every_s / 4, REACH_EVERY_S))
        finally:
            tasks = list(self._probing.values())
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def due(self, now: float) -> list[str]:
        """Hosts to probe now: no job, not down, not probed or sampled within ``every_s``."""
        out = []
        for name, rt in list(self._fleet.hosts.items()):
            task = self._probing.get(name)
            if task is not None and not task.done():
                continue
            last = self._probed_at.get(name, 0.0)
            if rt.sampled_at != self._ours.get(name):  # an executor's sample is the newest
                last = max(last, rt.sampled_at)
            if rt.released or rt.releasing:  # given back, or about to be: nothing to learn
                continue
            if rt.job is None and rt.state is not HostState.DOWN and now - last >= self.every_s:
                out.append(name)
        return out

    async def settle(self, name: str) -> None:
        """Wait out a health probe of ``name`` in flight (bounded by its command timeout): a
        host chosen for release was probed once more while its release command ran, and the
        probe's deploy wrote its bundle folder back under the root just given back."""
        task = self._probing.get(name)
        if task is not None and not task.done():
            await asyncio.gather(asyncio.shield(task), return_exceptions=True)

    async def probe(self, name: str) -> None:
        """One health probe of ``name``; its sample or its failure lands in the fleet."""
        inv, fleet = self._inv, self._fleet
        async with self._slots:
            began = time.monotonic()
            try:
                h = await probe_health(
                    fleet.hosts[name].transport,
                    root=inv.host_root(name),
                    python=inv.python(name),
                    timeout=inv.console.command_timeout_s,
                    env=dict(self._env.get(name, {})),
                    may_deploy=self._may_deploy,
                )
            except NotDeployed:  # a read-only console writes nothing: no sample to show
                return
            except HealthProbeFailed as e:
                h, why = None, str(e)
        if name not in fleet.hosts or name not in inv.hosts:
            return
        if h is None:
            fleet.probe_failed(name, f"health probe failed: {why}")
        else:
            found = probe_findings(h, inv.hosts[name], inv.console.min_free_disk_gb)
            # its age is judged against the interval plus what a probe takes here
            took = time.monotonic() - began
            fleet.observe(name, h, every_s=self.every_s + took, extra=found)
            self._ours[name] = fleet.hosts[name].sampled_at
        self.check_spares()

    # ------------------------------------------------------------------ spares

    def check_spares(self) -> None:
        """An alert when a live job's spares are all unfit or down; a journal line when one is
        healthy again."""
        fleet = self._fleet
        live = self._spares()
        self._short &= set(live)
        self._unfit_since = {j: t for j, t in self._unfit_since.items() if j in live}
        for job, spares in live.items():
            spares = [s for s in spares if s in fleet.hosts]
            if not spares:  # wanted at each check while it has none: the provisioner retries
                self._need_host(f"job {job} has no spare")
                continue
            healthy = [s for s in spares if not self._why_unfit(s)]
            if healthy:
                self._unfit_since.pop(job, None)
            elif self._being_replaced(job, live):
                continue
            if not healthy:  # wanted at each check while it lasts: the provisioner retries
                self._need_host(f"job {job} has no healthy spare left")
            if not healthy and job not in self._short:
                self._short.add(job)
                why = "; ".join(f"{s}: {self._why_unfit(s)}" for s in spares)
                self._alert(f"job {job} has no healthy spare left ({why})", job=job)
            elif healthy and job in self._short:
                self._short.discard(job)
                self._journal.record(
                    Kind.PLACEMENT,
                    f"job {job}: spare {healthy[0]} is healthy again",
                    job=job,
                    host=healthy[0],
                    data={"healthy_spares": healthy},
                )

    def _being_replaced(self, job: str, live: Mapping[str, list[str]]) -> bool:
        """``job`` has had no healthy spare for less than ``replaced_within_s`` and a usable
        host no live job holds is there to replace one: its spare keeper does that."""
        now = time.monotonic()
        since = self._unfit_since.setdefault(job, now)
        held = {s for spares in live.values() for s in spares}
        return now - since < self._replaced_within_s and bool(self._fleet.usable(exclude=held))

    def _why_unfit(self, host: str) -> str:
        """Why ``host`` cannot take a failover now ("" when it can)."""
        rt = self._fleet.hosts[host]
        if rt.state is not HostState.UP:
            return rt.state.value
        return "; ".join(f.message for f in self._fleet.failing(host))
