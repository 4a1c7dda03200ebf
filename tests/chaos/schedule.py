"""When each fault of an episode comes, on which host, and how it is seen through.

Without overlap the faults come one at a time: each at a random step (seeded) once the one
before has been recovered from and healed, so that each incident can be told apart.

With ``Config.overlap`` (a probability per fault) the next fault may come before the last
recovery: a random moment (``OVERLAP_DELAY_S``) after it, on a job the dice pick (with two
jobs, often the other one: two jobs sharing the hosts), aimed at the host the console is
starting that job on now (its newest placement: a fault during a failover) or at its spare.
At most ``MAX_OPEN`` faults are open at once; ``solo`` faults (blips, whose check is that
nothing happens) and armed NaN/OOM never overlap. A host an open fault holds (cut off,
killed, full, failing) is not a target again until healed, and an overlapped fault's hold
is released at the latest ``HOSTAGE_S`` after it came, so that two faults cannot keep every
host from a job. How incidents are matched to overlapped faults: invariants.match_incidents.

A fault is seen through in two stages: until it may be healed (``heal_when``, by default
once the job runs again with nothing open), heal it, then until the job runs again.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from support.wait import wait_for

from chaos import faults as fz
from chaos import faults_fencing as ff
from chaos import faults_standby as fs
from chaos.fleet import Fleet
from chaos.observe import job_view, last_step
from chaos.torchrun import KIND as KIND_TORCHRUN
from console.records.journal import Kind

FAULT_TIMEOUT_S = 120.0
"""From a fault to a recovered job (a failover after a lease, a start, a load)."""
ARMED_GUARD_STEPS = 1500
"""No other fault is injected this close before an armed NaN/OOM: they stay apart."""
MAX_OPEN = 2
HOSTAGE_S = 25.0
QUIET_AFTER_S = ff.LEASE_S + ff.SKEW_S + 1.0
"""A solo fault is seen through only this long after it was healed: what it might wrongly
cause (a failover) would have come by then, before the next fault."""
OVERLAP_DELAY_S = (0.2, ff.LEASE_S)
"""From one fault to an overlapping one: during detection, the lease wait, or the restart."""

INJECTORS: dict[str, Callable[[fz.Target], fz.Injected]] = {
    **fz.INJECTORS,
    **ff.INJECTORS,
    **fs.INJECTORS,
}
KINDS = (*INJECTORS, *fz.ARMED)
NEEDS_NAMESPACE = fz.NEEDS_NAMESPACE | ff.NEEDS_NAMESPACE
NEEDS_EXECUTOR = {"sigkill", "sigstop", "corrupt_checkpoint", "sigstop_past_lease"}
HOLDS_HOST = {"host_kill", "partition", "corrupt_replica", "gpu_fail", "sigstop_past_lease"}
HOLDS_HOST |= {"console_restart_partitioned"}
CONSOLE_KINDS = {"console_restart", "console_restart_partitioned", "second_console"}
"""Faults of the one controller of a fleet without etcd."""
STANDBY_KINDS = set(fs.KINDS)
"""Faults of standby controllers and their etcd (a fleet built with etcd)."""
SOLO = {"flap", "wall_clock_step"}
IN_PLACE = {"flap", "disk_full", "nan", "oom", "second_console", "wall_clock_step"}
IN_PLACE |= {"etcd_member_kill"}
"""Faults after which the same executor goes on (no new start)."""


@dataclass
class Open:
    f: fz.Injected
    since: float
    """time.monotonic() when the current stage began."""
    healed: bool = False
    heal_by: float | None = None
    """A time.monotonic() past which an overlapped fault is healed, recovered or not."""


class Scheduler:
    def __init__(
        self,
        fleet: Fleet,
        rng: random.Random,
        kinds: list[str],
        gap_steps: tuple[int, int],
        overlap: float,
        armed: dict[str, int],
        say: Callable[[str], None],
    ) -> None:
        self.fleet = fleet
        self.rng = rng
        self.kinds = kinds
        self.gap_steps = gap_steps
        self.overlap = overlap
        self.armed = armed
        self.fired: set[str] = set()
        self.say = say
        self.faults: list[fz.Injected] = []
        self.skipped: list[str] = []
        self.open: list[Open] = []

    # ------------------------------------------------------------------ run

    def run(self) -> None:
        todo = [k for k in self.kinds if k not in fz.ARMED]
        overlap_next = False
        while todo:
            picked = self._overlapping(todo) if overlap_next and self.open else None
            if picked is None:
                self._finish_open()
                picked = self._next_alone(todo)
                if picked is None:
                    break
            todo.remove(picked[1])
            f = self._inject(*picked)
            overlap_next = (
                not f.solo
                and self.rng.random() < self.overlap
                and len(self.open) < MAX_OPEN
                and not self._armed_near()
            )
        self._finish_open()
        self.skipped += [f"{k} (the job ended first)" for k in todo]
        for kind in self.armed:
            if kind not in self.fired:
                self._await_armed(kind)

    def _next_alone(self, todo: list[str]) -> tuple[str, str] | None:
        """A fault (job, kind) to inject with nothing open: the jobs in a random order, each
        settled, until one has a host that fits a kind left. None once the jobs have ended
        (what is left is then skipped), or when no job fits any kind left."""
        jobs = [j.name for j in self.fleet.jobs]
        self.rng.shuffle(jobs)
        ended = 0
        for job in jobs:
            if not self._settle(job):
                ended += 1
                continue
            kind = next((k for k in todo if self._fits(job, k, during=False)), None)
            if kind is not None:
                return job, kind
        if ended < len(jobs):
            self.skipped += [f"{k} (no host fits it now)" for k in todo]
            todo.clear()
        return None

    def _inject(self, job: str, kind: str) -> fz.Injected:
        during = bool(self.open)
        target = self._target(job, during)
        f = INJECTORS[kind](target)
        f.solo = f.solo or kind in SOLO
        self.faults.append(f)
        o = Open(f, time.monotonic())
        if during:
            for other in [*self.open, o]:
                other.f.overlapped = True
                other.heal_by = time.monotonic() + HOSTAGE_S
        self.open.append(o)
        self.say(
            f"  {kind} on {f.host} ({job}){' during recovery' if during else ''} {f.note}".rstrip()
        )
        return f

    def _target(self, job: str, during: bool) -> fz.Target:
        v = job_view(self.fleet.journal(), job)
        host = (v.placed if during else v.host) or v.host
        assert host is not None
        return fz.Target(self.fleet, job, host, (v.spares or [None])[0], self.rng)

    def _held(self) -> set[str]:
        return {o.f.host for o in self.open if o.f.kind in HOLDS_HOST and not o.healed}

    def _fits(self, job: str, kind: str, *, during: bool) -> bool:
        fleet = self.fleet
        v = job_view(fleet.journal(), job)
        host = (v.placed if during else v.host) or v.host
        if v.finished or host is None:
            return False
        if kind in CONSOLE_KINDS and (fleet.console is None or fleet.console.poll() is not None):
            return False
        if kind in CONSOLE_KINDS and fleet.etcd is not None:
            return False  # one controller's faults: in standby mode a leader_kill is the kill
        if kind in STANDBY_KINDS:
            return self._standby_fits(kind)
        if kind in ("console_restart", "second_console"):
            return True
        if host in self._held():
            return False
        if kind in NEEDS_NAMESPACE and not fleet.namespaced(host):
            return False
        if kind in NEEDS_EXECUTOR and fz.live_pid(fleet, host, job) is None:
            return False
        if kind in fz.NEEDS_REPLICA:
            spare = (v.spares or [None])[0]
            return (
                spare is not None
                and spare not in self._held()
                and fz.newest_complete(fleet.replicas(spare, job)) is not None
            )
        return True

    def _standby_fits(self, kind: str) -> bool:
        etcd = self.fleet.etcd
        if etcd is None:
            return False
        if kind == "etcd_member_kill":  # one member down at a time: never a loss of quorum
            return all(etcd.alive(n) for n in etcd.names)
        return self.fleet.leading_slot() is not None

    def _overlapping(self, todo: list[str]) -> tuple[str, str] | None:
        """A fault (job, kind) to inject while the ones open are still being recovered from."""
        self._poll_for(self.rng.uniform(*OVERLAP_DELAY_S))
        if not self.open:
            return None
        job = self.rng.choice([j.name for j in self.fleet.jobs])
        kind = next((k for k in todo if k not in SOLO and self._fits(job, k, during=True)), None)
        return None if kind is None else (job, kind)

    def _armed_jobs(self) -> list[str]:
        """The jobs an armed NaN/OOM fires in: the torch workload's (a torchrun job's script
        reads no HOTSPARE_INJECT)."""
        return [j.name for j in self.fleet.jobs if j.kind != KIND_TORCHRUN]

    def _armed_near(self) -> bool:
        """An armed NaN/OOM is close ahead of some job: no fault may overlap into it."""
        for name in self._armed_jobs():
            v = job_view(self.fleet.journal(), name)
            step = last_step(self.fleet.workdir(v.host, name)) if v.host else 0
            for kind, at in self.armed.items():
                if kind not in self.fired and at - 2 * ARMED_GUARD_STEPS <= step:
                    return True
        return False

    # ------------------------------------------------------------ recovery

    def _poll(self, o: Open) -> bool:
        """Move one open fault on; True once it is seen through."""
        f = o.f
        if not o.healed:
            ready = f.heal_when() if f.heal_when is not None else self._recovered(f)
            if not ready and f.heal_when is None and o.heal_by and time.monotonic() > o.heal_by:
                ready = True  # an overlapped fault lets go of its host
            if ready:
                if f.heal is not None:
                    f.heal()
                    f.heal = None
                o.healed, o.since = True, time.monotonic()
        quiet = not f.solo or time.monotonic() - o.since >= QUIET_AFTER_S
        if o.healed and quiet and self._recovered(f):
            f.recovered_at = time.time()
            if f.violations or f.inconclusive or f.figures or ";" in f.note:
                self.say(f"    {f.kind} on {f.host} ({f.job}) seen through: {f.note}")
            for v in f.violations:
                self.say(f"    VIOLATION {v}")
            for i in f.inconclusive:
                self.say(f"    INCONCLUSIVE {i}")
            for m in f.missed:
                self.say(f"    target missed: {m}")
            return True
        if time.monotonic() - o.since > FAULT_TIMEOUT_S:
            stage = "recover from" if not o.healed else "run again after"
            raise AssertionError(
                f"timed out after {FAULT_TIMEOUT_S:.0f}s waiting for {f.job} to {stage} {f.kind}"
            )
        return False

    def _poll_for(self, seconds: float) -> None:
        """Keep the open faults moving for ``seconds`` (a random delay chosen by the dice)."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self._poll_open()
            time.sleep(0.1)

    def _poll_open(self) -> None:
        self.fleet.check_console()
        self.open = [o for o in self.open if not self._poll(o)]

    def _finish_open(self) -> None:
        while self.open:
            self._poll_open()
            if self.open:
                time.sleep(0.1)

    def _recovered(self, f: fz.Injected) -> bool:
        """The job runs again with no incident open (on any host), or has finished."""
        v = job_view(self.fleet.journal(), f.job)
        if v.finished:
            return True
        if v.state != "running" or v.open_incidents:
            return False
        return f.kind in IN_PLACE or v.running_since >= f.t - 0.5

    def _settle(self, job: str) -> bool:
        """Until the job runs with nothing open and has trained a random number of steps more
        (and no armed fault is near); False once it has finished."""
        fleet = self.fleet

        def ready() -> tuple[str, int] | None:
            fleet.check_console()
            events = fleet.journal()
            v = job_view(events, job)
            if v.finished:
                return ("finished", 0)
            if v.state != "running" or v.open_incidents or v.host is None:
                return None
            if not any(e.kind is Kind.CHECKPOINT and e.t > v.running_since for e in events):
                return None
            return (v.host, last_step(fleet.workdir(v.host, job)))

        got = wait_for(ready, FAULT_TIMEOUT_S, f"{job} running with no open incident", interval=0.1)
        if got[0] == "finished":
            return False
        target = got[1] + self.rng.randint(*self.gap_steps)
        for kind, step in self.armed.items() if job in self._armed_jobs() else ():
            if kind not in self.fired and step - ARMED_GUARD_STEPS <= target:
                self._await_armed(kind)
                return self._settle(job)

        def far_enough() -> bool | str:
            v = job_view(fleet.journal(), job)
            if v.finished:
                return "finished"
            if v.host is None or v.host != got[0] or v.open_incidents:
                return False
            return last_step(fleet.workdir(v.host, job)) >= target

        return (
            wait_for(far_enough, FAULT_TIMEOUT_S, f"{job} at step {target}", interval=0.1) is True
        )

    def _await_armed(self, kind: str) -> None:
        """Until the armed fault has fired in every job (the same HOTSPARE_INJECT reaches every
        host, so each job meets it at its step) and each has recovered."""
        step = self.armed[kind]
        self.fired.add(kind)
        for job in self._armed_jobs():

            def fired(job: str = job) -> Any:
                for e in self.fleet.journal():
                    if e.kind is Kind.FAULT and e.job == job and e.data.get("fault") == kind:
                        return e
                return "finished" if job_view(self.fleet.journal(), job).finished else None

            e = wait_for(
                fired,
                FAULT_TIMEOUT_S + 60,
                f"the armed {kind}@{step} to fire in {job}",
                interval=0.1,
            )
            if e == "finished":
                continue
            f = fz.Injected(kind, job, e.host or "", e.t, (kind,), note=f"at step {step}")
            self.faults.append(f)
            self.say(f"  {kind} fired on {f.host} ({job}) at step {step}")
            self.open.append(Open(f, time.monotonic()))
        self._finish_open()
