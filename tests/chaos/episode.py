"""One seeded chaos episode: a fleet, its jobs, a schedule of faults, and every check.

The faults come one at a time, or overlapping (``Config.overlap``; see chaos.schedule);
NaN and OOM are armed at random steps before the run (HOTSPARE_INJECT, on every host, and
the same in the uninterrupted run the params_sha256 is compared with). While it runs, two
watchers record what the checks read besides the journal: /proc (chaos.procs) and every
host's disk (chaos.disk).
"""

from __future__ import annotations

import random
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from support.fleetbed import FULL_SPEED_ENV
from support.helpers import REPO, env_with

from chaos import ending, fencing, torchrun
from chaos import invariants as inv
from chaos.disk import DiskWatch
from chaos.epochs import EpochSampler
from chaos.faults import ARMED, Injected
from chaos.fleet import Fleet, JobPlan
from chaos.procs import Sampler
from chaos.schedule import Scheduler
from console.records.journal import Event, Kind


@dataclass
class Config:
    seed: int
    kinds: list[str]
    """The faults to inject, in the order tried (ARMED ones are placed at random steps)."""
    steps: int = 16000
    checkpoint_every: int = 200
    jobs: int = 1
    """Two: the second job (its own host and spare) shares the fleet and its faults."""
    torchrun: int = 0
    """How many of the jobs, the first ones, are torchrun jobs (chaos.torchrun), not torch."""
    overlap: float = 0.0
    """The chance that the next fault comes before the last recovery (chaos.schedule)."""
    gap_steps: tuple[int, int] = (100, 400)
    standby: bool = False
    """Two controllers on a 3-member etcd cluster (chaos.faults_standby)."""
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
    """Incidents no fault explains."""
    by_overlap: int = 0
    """Incidents put down to overlapping faults (see invariants.match_incidents)."""
    false_failovers: int = 0
    two_trainers: int = 0
    """Intervals in which two processes of one job trained at once (/proc)."""
    stale_files: int = 0
    """Checkpoints an epoch published after its lease had ended (disk mtimes)."""
    stale_samples: int = 0
    """/proc samples in which a process of a torchrun job's ended epoch lived beside one of a
    newer epoch (chaos.epochs)."""
    epoch_samples: int = 0
    """/proc samples the epoch sampler took (0: no torchrun job)."""
    epochs_unseen: int = 0
    """Torchrun jobs, or epochs of them, the epoch sampler never saw (each also inconclusive)."""
    inconclusive: list[str] = field(default_factory=list)
    """The episode's checks that could not be made, not a fault's own (those are on
    ``Injected.inconclusive``): a torchrun epoch /proc never showed, a load whose manifest the
    disk watcher never saw. Each is also a violation (see chaos.invariants)."""
    job_kinds: dict[str, str] = field(default_factory=dict)
    corrupt_skips: int = 0
    loads: int = 0
    """Checkpoints loaded by executors (resumes and NaN rollbacks), each checked."""
    wall_s: float = 0.0
    report: str = ""


def _say(cfg: Config, msg: str) -> None:
    if cfg.log is not None:
        cfg.log(msg)


def _baseline(fleet: Fleet, plan: JobPlan) -> subprocess.Popen[str]:
    """The job uninterrupted, by the executor alone, with the same armed faults (a torchrun
    job under its baseline name: chaos.torchrun)."""
    spec, job = fleet.inventory, plan.name
    if plan.kind == torchrun.KIND:
        spec, job = fleet.baseline_inventory, torchrun.BASELINE_PREFIX + plan.name
    assert spec is not None
    extra = dict(FULL_SPEED_ENV, HOTSPARE_INJECT=fleet.inject) if fleet.inject else FULL_SPEED_ENV
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "executors.cli",
            "run",
            "--spec",
            str(spec),
            "--job",
            job,
            "--workdir",
            str(fleet.folder / f"baseline-{plan.name}"),
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


def _where(e: BaseException) -> str:
    """Where an exception came from: file:line of its innermost frame, and the line."""
    frame = traceback.extract_tb(e.__traceback__)[-1]
    return f"{Path(frame.filename).name}:{frame.lineno}: {frame.line}"


class Episode:
    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.rng = random.Random(cfg.seed)
        self.result = Result(cfg.seed)
        self.armed: dict[str, int] = {}
        self._checked = False

    # ------------------------------------------------------------------ run

    def run(self) -> Result:
        t0 = time.monotonic()
        with ending.held():  # what a half-built fleet made, its close would not find
            fleet = Fleet.build(self.cfg.seed, standby=self.cfg.standby)
        sampler: Sampler | None = None
        disk: DiskWatch | None = None
        epochs = EpochSampler(jobs=set())
        baselines: dict[str, subprocess.Popen[str]] = {}
        try:
            ending.end_if_asked()
            self._plan(fleet)
            epochs.jobs = set(self._torchruns(fleet))
            epochs.mark = str(fleet.folder).encode()  # in every executor's HOTSPARE_FAKE_NVML
            baselines.update({j.name: _baseline(fleet, j) for j in fleet.jobs})
            sampler = Sampler(
                {
                    j.name: [fleet.workdir(h, j.name) for h in fleet.hosts]
                    for j in fleet.jobs
                    if j.kind != torchrun.KIND
                }
            ).start()
            if epochs.jobs:
                epochs.start()
            disk = DiskWatch(
                {name: h.root for name, h in fleet.hosts.items()}, [j.name for j in fleet.jobs]
            ).start()
            fleet.start_console()
            sched = Scheduler(
                fleet,
                self.rng,
                self.cfg.kinds,
                self.cfg.gap_steps,
                self.cfg.overlap,
                self.armed,
                lambda m: _say(self.cfg, m),
            )
            try:
                sched.run()
            finally:
                self.result.faults, self.result.skipped = sched.faults, sched.skipped
            rc = fleet.console_exit(timeout=600)
            if rc != 0:
                self.result.violations.append(
                    f"hotspare run exited {rc}: {fleet.console_stderr()[-1500:]}"
                )
            shas = {name: _baseline_sha(p, 600) for name, p in baselines.items()}
            for j in self._torchruns(fleet):  # their state, hashed here (chaos.torchrun)
                base = fleet.folder / f"baseline-{j}"
                shas[j] = torchrun.state_sha256(torchrun.final_checkpoint(base, self.cfg.steps))
            sampler.stop()
            epochs.stop()
            disk.stop()
            self._check(fleet, sampler, epochs, disk, shas)
        except AssertionError as e:
            self.result.violations.append(str(e) or f"assertion failed: {_where(e)}")
        except Exception as e:
            self.result.violations.append(f"chaos harness: {type(e).__name__}: {e} ({_where(e)})")
        finally:
            for watcher in (sampler, epochs, disk):
                if watcher is not None:
                    watcher.stop()
            if not self._checked and not ending.asked() and sampler and disk:
                try:  # the run broke off: what the watchers saw until then is still evidence
                    self._fencing(fleet, sampler, epochs, disk, fleet.journal())
                except Exception as e:
                    self.result.violations.append(f"chaos harness: fencing checks: {e}")
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
            fleet.close(keep=self.cfg.keep or (bool(self.result.violations) and not ending.asked()))
            self.result.wall_s = time.monotonic() - t0
            if self.result.violations:
                _say(self.cfg, f"seed {self.cfg.seed}: kept {fleet.folder} for a post-mortem")
        return self.result

    def _plan(self, fleet: Fleet) -> None:
        cfg = self.cfg
        steps = cfg.steps
        spots = sorted(self.rng.sample(range(int(0.15 * steps), int(0.8 * steps), 500), 2))
        plans = [JobPlan("j", "a", "b", steps, 11), JobPlan("k", "d", "c", steps, 12)]
        plans = plans[: cfg.jobs]
        for plan in plans[: cfg.torchrun]:
            plan.kind = torchrun.KIND
        self.result.job_kinds = {p.name: p.kind for p in plans}
        armed = [k for k in ARMED if k in cfg.kinds]
        if all(p.kind == torchrun.KIND for p in plans):  # armed in the torch workload alone
            self.result.skipped += [f"{k} (no torch-kind job to arm it in)" for k in armed]
            armed = []
        for kind, step in zip(armed, spots, strict=False):
            self.armed[kind] = step
        fleet.inject = ",".join(f"{k}@{s}" for k, s in self.armed.items())
        fleet.write_inventory(plans, cfg.checkpoint_every)
        kinds = ", ".join(f"{p.name} {p.kind}" for p in plans)
        _say(cfg, f"seed {cfg.seed}: jobs {kinds}; armed {fleet.inject or 'nothing'}")

    @staticmethod
    def _torchruns(fleet: Fleet) -> list[str]:
        return [j.name for j in fleet.jobs if j.kind == torchrun.KIND]

    # --------------------------------------------------------------- checks

    def _check(
        self,
        fleet: Fleet,
        sampler: Sampler,
        epochs: EpochSampler,
        disk: DiskWatch,
        shas: dict[str, str],
    ) -> None:
        r = self.result
        events = fleet.journal()
        torchruns = self._torchruns(fleet)
        r.violations += inv.finished(events, {j: s for j, s in shas.items() if j not in torchruns})
        done = {e.job or "": e.host or "" for e in events if e.kind is Kind.FINISHED}
        for j in torchruns:
            r.violations += torchrun.finished(done, fleet.workdir, j, self.cfg.steps, shas[j])
        self._fencing(fleet, sampler, epochs, disk, events)
        for j in fleet.jobs:
            workdirs = [fleet.workdir(h, j.name) for h in fleet.hosts]
            r.violations += inv.checkpoint_epochs(events, workdirs, j.name)
            bad, loads, unsure = inv.loads_whole(disk, j.name)
            r.violations += bad + [f"inconclusive: {u}" for u in unsure]
            r.inconclusive += unsure
            r.loads += loads
        bad, r.corrupt_skips = inv.corrupt_loads(r.faults)
        r.violations += bad
        r.report = fleet.report()
        again = inv.armed_again(events, self.armed, r.faults)  # matched, not counted as injected
        r.matches, r.leftover, r.by_overlap = inv.match_incidents(
            events, r.faults + again, r.report
        )
        r.false_failovers = len(inv.false_failovers(r.leftover))
        r.violations += [
            f"{m.fault.kind} on {m.fault.host} at {m.fault.t:.3f}: {m.why}"
            for m in r.matches
            if not m.ok
        ]
        r.violations += inv.inconclusive(r.faults)

    def _fencing(
        self,
        fleet: Fleet,
        sampler: Sampler,
        epochs: EpochSampler,
        disk: DiskWatch,
        events: list[Event],
    ) -> None:
        """The checks that need no finished run: two trainers (a torchrun job: its processes
        by epoch), stale epochs, what each fault saw itself."""
        self._checked = True
        r = self.result
        bad, r.two_trainers = fencing.two_trainers(sampler)
        r.violations += bad
        r.epoch_samples = epochs.samples
        for j in fleet.jobs:
            if j.kind == torchrun.KIND:
                bad, stale, unseen = torchrun.stale_epochs(epochs, disk, j.name)
                r.violations += bad  # its inconclusives among them, last
                r.stale_samples += stale
                r.epochs_unseen += unseen
                r.inconclusive += bad[len(bad) - unseen :] if unseen else []
            else:
                r.violations += fencing.journal_epochs(events, sampler, j.name)
            ends = fencing.lease_ends(fencing.epoch_starts(events, disk, j.name))
            bad, n = fencing.stale_files(disk, ends, j.name)
            r.violations += bad
            r.stale_files += n
            r.violations += fencing.stale_steps(disk, ends, j.name, command=j.kind != "torch")
            r.violations += fencing.epoch_hosts(disk, j.name)
            r.violations += fencing.replica_origins(disk, j.name)
        for f in r.faults:
            r.violations += f.violations
