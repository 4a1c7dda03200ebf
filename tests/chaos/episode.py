"""One seeded chaos episode: a fleet, its jobs, a schedule of faults, and every check.

The faults come one at a time, each at a random step (seeded) once the one before has been
recovered from, so that each incident can be told apart; NaN and OOM are armed at random
steps before the run (HOTSPARE_INJECT, on every host, and the same in the uninterrupted run
the params_sha256 is compared with).
"""

from __future__ import annotations

import random
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from fleetbed import EXECUTOR_ENV
from helpers import REPO, env_with

from chaos import invariants as inv
from chaos.faults import (
    ARMED,
    INJECTORS,
    NEEDS_NAMESPACE,
    NEEDS_REPLICA,
    Injected,
    Target,
    newest_complete,
)
from chaos.fleet import Fleet, JobPlan, wait_until
from chaos.observe import Sampler, job_view, journal, last_step
from console.records.journal import Kind

FAULT_TIMEOUT_S = 120.0
"""From a fault to a recovered job (a failover after a lease, a start, a load)."""
ARMED_GUARD_STEPS = 1500
"""No other fault is injected this close before an armed NaN/OOM: they stay apart."""


@dataclass
class Config:
    seed: int
    kinds: list[str]
    """The faults to inject, in the order tried (ARMED ones are placed at random steps)."""
    steps: int = 16000
    checkpoint_every: int = 200
    jobs: int = 1
    gap_steps: tuple[int, int] = (100, 400)
    keep: bool = False
    log: Any = None


@dataclass
class Result:
    seed: int
    faults: list[Injected] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    matches: list[inv.Match] = field(default_factory=list)
    leftover: list[Any] = field(default_factory=list)
    false_failovers: int = 0
    corrupt_skips: int = 0
    loads: int = 0
    """Checkpoints loaded by executors (resumes and NaN rollbacks), each checked."""
    wall_s: float = 0.0
    report: str = ""


def _say(cfg: Config, msg: str) -> None:
    if cfg.log is not None:
        cfg.log(msg)


def _baseline(fleet: Fleet, job: str) -> subprocess.Popen[str]:
    """The job uninterrupted, by the executor alone, with the same armed faults."""
    assert fleet.inventory is not None
    extra = dict(EXECUTOR_ENV, HOTSPARE_INJECT=fleet.inject) if fleet.inject else EXECUTOR_ENV
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "executors.cli",
            "run",
            "--spec",
            str(fleet.inventory),
            "--job",
            job,
            "--workdir",
            str(fleet.folder / f"baseline-{job}"),
            "--json",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env=env_with(**extra),
    )


def _baseline_sha(proc: subprocess.Popen[str], timeout: float) -> str:
    import json

    out, err = proc.communicate(timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError(f"the uninterrupted run failed: {err[-2000:]}")
    return json.loads(out.strip().splitlines()[-1])["params_sha256"]


class Episode:
    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.rng = random.Random(cfg.seed)
        self.result = Result(cfg.seed)
        self.armed: dict[str, int] = {}
        self.fired: set[str] = set()

    # ------------------------------------------------------------------ run

    def run(self) -> Result:
        t0 = time.monotonic()
        fleet = Fleet.build(self.cfg.seed)
        sampler: Sampler | None = None
        baselines: dict[str, subprocess.Popen[str]] = {}
        try:
            self._plan(fleet)
            baselines.update({j.name: _baseline(fleet, j.name) for j in fleet.jobs})
            sampler = Sampler(
                {j.name: [fleet.workdir(h, j.name) for h in fleet.hosts] for j in fleet.jobs}
            ).start()
            fleet.start_console()
            self._inject_all(fleet)
            rc = fleet.console_exit(timeout=600)
            if rc != 0:
                self.result.violations.append(
                    f"hotspare run exited {rc}: {fleet.console_stderr()[-1500:]}"
                )
            shas = {name: _baseline_sha(p, 600) for name, p in baselines.items()}
            sampler.stop()
            self._check(fleet, sampler, shas)
        except AssertionError as e:
            self.result.violations.append(str(e))
        except Exception as e:
            self.result.violations.append(f"chaos harness: {type(e).__name__}: {e}")
        finally:
            if sampler is not None:
                sampler.stop()
            for proc in baselines.values():
                if proc.poll() is None:
                    proc.kill()
                    proc.communicate(timeout=30)
            for f in self.result.faults:
                if f.heal is not None:
                    try:
                        f.heal()
                    except Exception as e:
                        _say(self.cfg, f"heal of {f.kind} failed: {e}")
            fleet.close(keep=self.cfg.keep or bool(self.result.violations))
            self.result.wall_s = time.monotonic() - t0
            if self.result.violations:
                _say(self.cfg, f"seed {self.cfg.seed}: kept {fleet.folder} for a post-mortem")
        return self.result

    def _plan(self, fleet: Fleet) -> None:
        cfg = self.cfg
        steps = cfg.steps
        spots = sorted(self.rng.sample(range(int(0.15 * steps), int(0.8 * steps), 500), 2))
        for kind, step in zip([k for k in ARMED if k in cfg.kinds], spots, strict=False):
            self.armed[kind] = step
        fleet.inject = ",".join(f"{k}@{s}" for k, s in self.armed.items())
        plans = [JobPlan("j", "a", "b", steps, 11), JobPlan("k", "d", "c", steps, 12)]
        fleet.write_inventory(plans[: cfg.jobs], cfg.checkpoint_every)
        _say(cfg, f"seed {cfg.seed}: armed {fleet.inject or 'nothing'}")

    # ------------------------------------------------------------ schedule

    def _inject_all(self, fleet: Fleet) -> None:
        todo = [k for k in self.cfg.kinds if k not in ARMED]
        while todo:
            job = self.rng.choice([j.name for j in fleet.jobs])
            if not self._settle(fleet, job):
                break
            kind = next((k for k in todo if self._fits(fleet, job, k)), None)
            if kind is None:
                self.result.skipped += [f"{k} (no host fits it now)" for k in todo]
                todo = []
                break
            todo.remove(kind)
            view = job_view(journal(fleet.state_dir), job)
            assert view.host is not None
            target = Target(fleet, job, view.host, (view.spares or [None])[0], self.rng)
            f = INJECTORS[kind](target)
            self.result.faults.append(f)
            _say(self.cfg, f"  {kind} on {f.host} ({job}) {f.note}")
            self._recover(fleet, f)
        self.result.skipped += [f"{k} (the job ended first)" for k in todo]
        for kind in self.armed:
            if kind not in self.fired:
                self._await_armed(fleet, kind)

    def _fits(self, fleet: Fleet, job: str, kind: str) -> bool:
        view = job_view(journal(fleet.state_dir), job)
        if view.host is None:
            return False
        if kind in NEEDS_NAMESPACE and not fleet.namespaced(view.host):
            return False
        if kind in NEEDS_REPLICA:
            spare = (view.spares or [None])[0]
            return spare is not None and newest_complete(fleet.replicas(spare, job)) is not None
        return True

    def _settle(self, fleet: Fleet, job: str) -> bool:
        """Until the job runs with nothing open and has trained a random number of steps more
        (and no armed fault is near); False once it has finished."""

        def ready() -> tuple[str, int] | None:
            fleet.check_console()
            events = journal(fleet.state_dir)
            v = job_view(events, job)
            if v.finished:
                return ("finished", 0)
            if v.state != "running" or v.open_incidents or v.host is None:
                return None
            if not any(e.kind is Kind.CHECKPOINT and e.t > v.running_since for e in events):
                return None
            return (v.host, last_step(fleet.workdir(v.host, job)))

        got = wait_until(ready, FAULT_TIMEOUT_S, f"{job} running with no open incident")
        if got[0] == "finished":
            return False
        target = got[1] + self.rng.randint(*self.cfg.gap_steps)
        for kind, step in self.armed.items():
            if kind not in self.fired and step - ARMED_GUARD_STEPS <= target:
                self._await_armed(fleet, kind)
                return self._settle(fleet, job)

        def far_enough() -> bool | str:
            v = job_view(journal(fleet.state_dir), job)
            if v.finished:
                return "finished"
            if v.host is None or v.host != got[0] or v.open_incidents:
                return False
            return last_step(fleet.workdir(v.host, job)) >= target

        return wait_until(far_enough, FAULT_TIMEOUT_S, f"{job} at step {target}") is True

    def _await_armed(self, fleet: Fleet, kind: str) -> None:
        step = self.armed[kind]
        self.fired.add(kind)

        def fired() -> Any:
            for e in journal(fleet.state_dir):
                if e.kind is Kind.FAULT and e.data.get("fault") == kind:
                    return e
            return None

        e = wait_until(fired, FAULT_TIMEOUT_S + 60, f"the armed {kind}@{step} to fire")
        f = Injected(kind, e.job or "", e.host or "", e.t, (kind,), note=f"at step {step}")
        self.result.faults.append(f)
        _say(self.cfg, f"  {kind} fired on {f.host} at step {step}")
        self._recover(fleet, f)

    def _recover(self, fleet: Fleet, f: Injected) -> None:
        """Until the fault has been dealt with; then heal what outlives it."""
        if f.kind == "disk_full":
            wait_until(
                lambda: any(
                    e.kind is Kind.REPLICA and e.host == f.host and not e.data.get("ok", True)
                    for e in journal(fleet.state_dir)
                    if e.t >= f.t
                ),
                FAULT_TIMEOUT_S,
                f"a replica to the full {f.host} to fail",
            )
        if f.heal is not None and f.kind != "disk_full":
            wait_until(
                lambda: _moved_or_recovered(fleet, f),
                FAULT_TIMEOUT_S,
                f"{f.job} to recover from {f.kind}",
            )
        if f.heal is not None:
            f.heal()
            f.heal = None
        wait_until(
            lambda: _moved_or_recovered(fleet, f), FAULT_TIMEOUT_S, f"{f.job} after {f.kind}"
        )

    # --------------------------------------------------------------- checks

    def _check(self, fleet: Fleet, sampler: Sampler, shas: dict[str, str]) -> None:
        r = self.result
        events = journal(fleet.state_dir)
        r.violations += inv.finished(events, shas)
        r.violations += inv.processes(sampler)
        for j in fleet.jobs:
            workdirs = [fleet.workdir(h, j.name) for h in fleet.hosts]
            r.violations += inv.journal_epochs(events, j.name)
            r.violations += inv.checkpoint_epochs(events, workdirs, j.name)
            bad, loads = inv.loads_whole(workdirs, j.name)
            r.violations += bad
            r.loads += loads
        bad, r.corrupt_skips = inv.corrupt_loads(r.faults)
        r.violations += bad
        r.report = fleet.report()
        r.matches, r.leftover = inv.match_incidents(events, r.faults, r.report)
        r.false_failovers = len(inv.false_failovers(r.leftover))
        r.violations += [
            f"{m.fault.kind} on {m.fault.host} at {m.fault.t:.3f}: {m.why}"
            for m in r.matches
            if not m.ok
        ]


def _moved_or_recovered(fleet: Fleet, f: Injected) -> bool:
    """The job runs again with no incident open (on any host), or has finished."""
    v = job_view(journal(fleet.state_dir), f.job)
    if v.finished:
        return True
    if v.state != "running" or v.open_incidents:
        return False
    return f.kind in IN_PLACE or v.running_since >= f.t - 0.5


IN_PLACE = {"flap", "disk_full", "nan", "oom"}
"""Faults after which the same executor goes on (no new start)."""
