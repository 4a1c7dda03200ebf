"""The multi-host chaos episode: a three-member job (torch kind, the tiny charlm config of
groupbed.group_job, gloo between routed network namespaces) and two spares, on five sshd
hosts, under ``hotspare run --policy auto``, with faults one at a time in a seeded order, each
aimed at a member the dice pick (rank 0's host as often as any other).

The faults are the single-host injectors (chaos.faults, chaos.faults_fencing) aimed at one
member: its executor SIGKILLed or SIGSTOPped, its host killed (sshd and all under its root),
cut off and healed, frozen and cut off past its lease then continued, or the console
restarted. What is checked: the final params_sha256 is the uninterrupted three-host run's
(groupbed.group_baseline, computed once per spec); never two trainers of one node rank
(/proc); every resume of a committed step of the member's own shard (events.jsonl); no stale
publish or step after a newer epoch began (the disks: chaos.fencing); every fault an
incident of its class in ``hotspare report``. See chaos.group_checks.

Elastic mode (``GroupEpisode(cfg, elastic=True)``, ``scripts/chaos --group --elastic``): the
same job with ``min_hosts = 2`` and ``deterministic_reduce``, on three hosts and no spare, so
a lost member shrinks the group to its survivors (renumbered), and a killed or cut host, healed
once the shrunk group runs, is free again and the group grows back onto it. The checks then
mean: the final params_sha256 is the uninterrupted three-host run's (deterministic reduce);
never two trainers on one host, nor as one node rank of one epoch, nor on a host after an
epoch without it began (/proc); every load of a step some earlier epoch committed at its own
size, any member's shard; no stale publish or step; every fault an incident (a shrink whose
cause is the fault's class); every grow resolved with 0 lost steps; no epoch below min_hosts.
A fault comes only when the group is at full size again (min_hosts + 1 = 3 members here: a
fault that left it at min_hosts - 1 would only make it wait) and has committed a step at that
size since its last recovery.
"""

from __future__ import annotations

import os
import random
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from support import netbed
from support.fleetbed import EXECUTOR_ENV, write_inventory
from support.groupbed import group_baseline, group_job
from support.sshbed import SshBed
from support.wait import wait_for

from chaos import ending, fencing
from chaos import faults as fz
from chaos import group_checks as gc
from chaos import invariants as inv
from chaos.disk import DiskWatch
from chaos.episode import Config, Result, _where
from chaos.fleet import Fleet, JobPlan
from chaos.observe import job_view
from chaos.procs import Sampler
from chaos.schedule import FAULT_TIMEOUT_S, Scheduler
from console.records.incidents import incidents
from console.records.journal import Event, Kind

JOB = "j"
MEMBERS = ("a", "b", "c")
SPARES = ("d", "e")
KINDS = ("sigkill", "host_kill", "partition", "sigstop", "sigstop_past_lease", "console_restart")
"""The faults a group episode draws from (long mode: scripts/chaos --group)."""
EXPECT: dict[str, tuple[str, ...]] = {}
"""Incident classes that differ for a member from a single host's (none now: a frozen member's
incident is classed once a probe could tell, executor_hang when its host answers)."""
CONSOLE_EXIT_S = 240.0
PER_EPISODE = 4
ELASTIC = {"min_hosts": 2, "deterministic_reduce": True}
"""What makes the job elastic (with no spare and no other host: a loss shrinks it)."""
GAP_STEPS = (10, 40)
"""Steps trained between a recovery (and a checkpoint after it) and the next fault."""


class GroupFleet(Fleet):
    """Five sshd hosts, each in a routed namespace of its own (members reach each other's data
    address through this one), their disks plain folders (no disk faults here)."""

    elastic: bool = False

    @classmethod
    def build_group(cls, elastic: bool = False) -> GroupFleet:
        """The members and the spares; elastic: the members alone (no other host)."""
        folder = Path(tempfile.mkdtemp(prefix="czg-", dir="/tmp"))
        fleet = cls(folder, SshBed(folder / "bed"))
        fleet.elastic = elastic
        try:
            names = MEMBERS if elastic else (*MEMBERS, *SPARES)
            for name in names:
                fleet.hosts[name] = netbed.ns_host(fleet.bed, name, routed=True)
        except BaseException:
            fleet.close()
            raise
        return fleet

    def write_group_inventory(self, over: dict[str, Any]) -> Path:
        spares = [] if self.elastic else list(SPARES)
        job = {**group_job(**over), "hosts": list(MEMBERS), "spares": spares}
        hosts = {
            name: h.inventory_table("r1", **({"role": "spare"} if name in SPARES else {}))
            for name, h in self.hosts.items()
        }
        self.jobs = [JobPlan(JOB, MEMBERS[0], (spares or [""])[0], job["steps"], job["seed"])]
        self.inventory = write_inventory(
            self.folder / "inventory.toml", hosts=hosts, jobs={JOB: job}
        )
        return self.inventory

    def executor_env(self) -> dict[str, dict[str, str]]:
        return {name: dict(EXECUTOR_ENV) for name in self.hosts}


def members(events: list[Event], job: str) -> list[str]:
    """The job's hosts by node rank, as last placed."""
    placed = [
        e for e in events if e.job == job and e.kind is Kind.PLACEMENT and "members" in e.data
    ]
    return list(placed[-1].data["members"]) if placed else []


class GroupScheduler(Scheduler):
    """The single-host scheduler (settle, inject, heal, see through), aimed at a member the
    dice pick instead of always the job's (rank 0's) host."""

    rank: int | None = None
    """The node rank of the last target."""
    elastic: bool = False

    def _target(self, job: str, during: bool) -> fz.Target:
        events = self.fleet.journal()
        hosts = members(events, job)
        host = self.rng.choice(hosts)
        if fz.live_pid(self.fleet, host, job) is None:
            host = next((h for h in hosts if fz.live_pid(self.fleet, h, job)), host)
        spare = (job_view(events, job).spares or [None])[0]
        self.rank = hosts.index(host)
        return fz.Target(self.fleet, job, host, spare, self.rng)

    def _settle(self, job: str) -> bool:
        """As for one host, and until the spare holds every member's shard of one step: a host
        lost before any step was replicated would only start the group again from step 0.
        Elastic: first until the group is back at full size (the host the last fault took,
        healed, grown onto) and has committed a step at that size since."""
        if self.elastic:
            return self._full(job) and super()._settle(job)
        if not super()._settle(job):
            return False

        def replicated() -> bool | str:
            v = job_view(self.fleet.journal(), job)
            if v.finished:
                return "finished"
            spare = (v.spares or [None])[0]
            return spare is not None and bool(common_steps(self.fleet.replicas(spare, job)))

        return (
            wait_for(replicated, FAULT_TIMEOUT_S, f"{job}'s shards on its spare", interval=0.1)
            is True
        )

    def _full(self, job: str) -> bool:
        """Until the newest epoch has every planned member, runs with nothing open, and has
        committed a step (every member's shard of it written): a fault then shrinks the group
        from its full size, and a shrink has a step of every member to resume from. False once
        the job has finished."""

        def full() -> bool | str:
            self.fleet.check_console()
            events = self.fleet.journal()
            v = job_view(events, job)
            if v.finished:
                return "finished"
            eps = gc.epochs(events, job)
            if v.state != "running" or v.open_incidents or not eps:
                return False
            if len(eps[-1].members) < len(MEMBERS) or eps[-1].number != v.epoch:
                return False
            return any(
                e.kind is Kind.CHECKPOINT
                and e.job == job
                and e.data.get("committed")
                and e.data.get("epoch") == v.epoch
                and e.t > v.running_since
                for e in events
            )

        what = f"{job} back at {len(MEMBERS)} members, with a step committed at that size"
        return wait_for(full, FAULT_TIMEOUT_S, what, interval=0.1) is True

    def _inject(self, job: str, kind: str) -> fz.Injected:
        f = super()._inject(job, kind)
        f.expect = EXPECT.get(kind, f.expect)
        f.note = f"node rank {self.rank}" + (f"; {f.note}" if f.note else "")
        if kind != "console_restart":
            self.say(f"    (node rank {self.rank})")
        return f


def common_steps(replicas: Path) -> set[int]:
    """Steps of which a spare holds every node rank's replica, complete (its manifest)."""
    held = [
        {int(p.stem.split("-")[1]) for p in (replicas / f"node-{r}").glob("step-*.json")}
        for r in range(len(MEMBERS))
    ]
    return set.intersection(*held)


def draw(rng: random.Random, n: int) -> list[str]:
    return [rng.choice(KINDS) for _ in range(n)]


def victims(results: list[Result]) -> str:
    """Faults by the node rank of the member they hit (a console restart hits none)."""
    ranks: dict[str, int] = {}
    for r in results:
        for f in r.faults:
            if f.kind != "console_restart":
                rank = f.note.split(";")[0].removeprefix("node rank ")
                ranks[rank] = ranks.get(rank, 0) + 1
    return "faults by node rank of the member hit: " + (
        ", ".join(f"rank {k}: {v}" for k, v in sorted(ranks.items())) or "none"
    )


def spec_for(kinds: list[str], elastic: bool = False) -> dict[str, Any]:
    """Steps for the faults (in multiples of 120, so that few baselines are needed); elastic:
    the job's elastic settings too, and twice the steps (it trains on while shrunk, until the
    host is healed and grown onto)."""
    if elastic:
        return {"steps": 240 * (1 + len(kinds)), "checkpoint_every_steps": 20, **ELASTIC}
    return {"steps": 120 * (1 + len(kinds)), "checkpoint_every_steps": 20}


class GroupEpisode:
    def __init__(
        self, cfg: Config, over: dict[str, Any] | None = None, *, elastic: bool = False
    ) -> None:
        """``over``: the job's settings over groupbed.group_job's (elastic: with ELASTIC's)."""
        self.cfg = cfg
        self.elastic = elastic
        self.over = over if over is not None else spec_for(cfg.kinds, elastic)
        if elastic:
            self.over = {**ELASTIC, **self.over}
        self.rng = random.Random(cfg.seed)
        self.result = Result(cfg.seed)
        self._checked = False

    def _say(self, msg: str) -> None:
        if self.cfg.log is not None:
            self.cfg.log(msg)

    def run(self) -> Result:
        t0 = time.monotonic()
        r = self.result
        try:
            sha = group_baseline(**self.over)  # before the fleet starts: cached per spec
        except (AssertionError, TimeoutError) as e:
            r.violations.append(f"the uninterrupted run failed: {e!r} ({_where(e)})")
            return r
        self._say(f"seed {self.cfg.seed}: uninterrupted run {time.monotonic() - t0:.1f} s")
        with ending.held():  # what a half-built fleet made, its close would not find
            fleet = GroupFleet.build_group(self.elastic)
        sampler: Sampler | None = None
        disk: DiskWatch | None = None
        try:
            ending.end_if_asked()
            fleet.write_group_inventory(self.over)
            workdirs = {h: fleet.workdir(h, JOB) for h in fleet.hosts}
            sampler = Sampler({JOB: list(workdirs.values())}).start()
            disk = DiskWatch({n: h.root for n, h in fleet.hosts.items()}, [JOB]).start()
            fleet.start_console()
            sched = GroupScheduler(
                fleet, self.rng, self.cfg.kinds, self.cfg.gap_steps, self.cfg.overlap, {}, self._say
            )
            sched.elastic = self.elastic
            try:
                sched.run()
            finally:
                r.faults, r.skipped = sched.faults, sched.skipped
            rc = fleet.console_exit(timeout=CONSOLE_EXIT_S)
            if rc != 0:
                r.violations.append(f"hotspare run exited {rc}: {fleet.console_stderr()[-1500:]}")
            sampler.stop()
            disk.stop()
            self._check(fleet, sampler, disk, sha, workdirs)
        except AssertionError as e:
            r.violations.append(str(e) or f"assertion failed: {_where(e)}")
        except Exception as e:
            r.violations.append(f"chaos harness: {type(e).__name__}: {e} ({_where(e)})")
        finally:
            for watcher in (sampler, disk):
                if watcher is not None:
                    watcher.stop()
            if not self._checked and not ending.asked() and sampler and disk:
                try:  # the run broke off: what the watchers saw until then is still evidence
                    self._fencing(fleet, sampler, disk, fleet.journal())
                except Exception as e:
                    r.violations.append(f"chaos harness: fencing checks: {e}")
            _heal_all(r.faults, self._say)
            fleet.close(keep=self.cfg.keep or (bool(r.violations) and not ending.asked()))
            r.wall_s = time.monotonic() - t0
            if r.violations:
                self._say(f"seed {self.cfg.seed}: kept {fleet.folder} for a post-mortem")
        return r

    def _check(
        self,
        fleet: GroupFleet,
        sampler: Sampler,
        disk: DiskWatch,
        sha: str,
        workdirs: dict[str, Path],
    ) -> None:
        r = self.result
        events = fleet.journal()
        r.violations += inv.finished(events, {JOB: sha})
        self._fencing(fleet, sampler, disk, events)
        r.violations += inv.checkpoint_epochs(events, list(workdirs.values()), JOB)
        eps = gc.epochs(events, JOB)
        if self.elastic:
            bad, r.loads = gc.elastic_loads(workdirs, eps, JOB)
            r.violations += bad
            r.violations += gc.elastic_memberships(eps, r.faults, JOB)
            r.violations += gc.sizes(eps, JOB, int(self.over["min_hosts"]), len(MEMBERS))
            r.violations += gc.grows(incidents(events), JOB)
        else:
            bad, r.loads = gc.committed_loads(
                workdirs, eps, disk, JOB, len(MEMBERS), any_shard=True
            )
            r.violations += bad
            r.violations += gc.memberships(events, r.faults, JOB)
        r.report = fleet.report()
        r.matches, r.leftover, r.by_overlap = inv.match_incidents(events, r.faults, r.report)
        r.false_failovers = len(inv.false_failovers(r.leftover))
        r.violations += [
            f"{m.fault.kind} on {m.fault.host} at {m.fault.t:.3f}: {m.why}"
            for m in r.matches
            if not m.ok
        ]
        r.violations += inv.inconclusive(r.faults)

    def _fencing(
        self, fleet: GroupFleet, sampler: Sampler, disk: DiskWatch, events: list[Event]
    ) -> None:
        """The checks that need no finished run: one trainer per node rank, no stale publish or
        step, one host per node rank and epoch, replicas of real shards, the faults' own."""
        self._checked = True
        r = self.result
        hosts = {os.path.normpath(fleet.workdir(h, JOB)): h for h in fleet.hosts}
        check = gc.elastic_trainers if self.elastic else gc.two_trainers_per_rank
        bad, r.two_trainers = check(sampler, gc.epochs(events, JOB), hosts, JOB)
        r.violations += bad
        ends = fencing.lease_ends(fencing.epoch_starts(events, disk, JOB))
        bad, r.stale_files = fencing.stale_files(disk, ends, JOB)
        r.violations += bad
        r.violations += fencing.stale_steps(disk, ends, JOB)
        r.violations += gc.rank_hosts(disk, JOB)
        r.violations += fencing.replica_origins(disk, JOB)
        for f in r.faults:
            r.violations += f.violations


def _heal_all(faults: list[fz.Injected], say: Callable[[str], None]) -> None:
    for f in faults:
        if f.heal is not None:
            try:
                f.heal()
            except Exception as e:
                say(f"heal of {f.kind} failed: {e}")
