"""The torchrun job's checks can fail: a process of an ended epoch beside the next one's is
reported (real processes in /proc), a sampler that saw nothing or missed an epoch is an
inconclusive that fails the run, a command job that resumed from a damaged checkpoint's
step (from its restored copy) is caught, and a command job's step after its lease is judged
by its own progress lines, not by the rate it reports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from support.wait import wait_for

from chaos import fencing, torchrun
from chaos import invariants as inv
from chaos.disk import DiskWatch, Line
from chaos.epochs import EpochSampler
from chaos.faults import Injected
from chaos.faults_fencing import _rate_bound


def _run(job: str, epoch: int, **extra: str) -> subprocess.Popen[bytes]:
    """A process /proc shows as one of ``job``'s run at ``epoch`` (its environment)."""
    env = {**os.environ, "HOTSPARE_JOB": job, "HOTSPARE_EPOCH": str(epoch), **extra}
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)


def _disk(job: str, *epochs: int) -> DiskWatch:
    """A disk record in which each epoch reported a step."""
    disk = DiskWatch({}, [job])
    for e in epochs:
        disk.lines.append(Line(time.time(), "a", job, {"kind": "progress", "epoch": e, "step": 5}))
    return disk


def test_an_old_epochs_process_beside_the_next_epochs_is_reported() -> None:
    job = f"chaos-t{os.getpid()}"
    procs = []
    try:
        with EpochSampler(jobs={job}) as sampler:
            procs += [_run(job, 1) for _ in range(3)]
            wait_for(lambda: len(sampler.seen.get((job, 1), ())) >= 3, 30, "epoch 1 seen")
            procs.append(_run(job, 2))
            wait_for(lambda: sampler.stale, 30, "a stale sample")
        bad, stale, unseen = torchrun.stale_epochs(sampler, _disk(job, 1, 2), job)
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert stale >= 1 and unseen == 0
    assert len(bad) == 1 and "beside epoch 2's" in bad[0], bad
    assert all(f"pid {p.pid} (epoch 1)" in bad[0] for p in procs[:3]), bad


def test_the_same_scene_with_epoch_1_gone_first_is_clean() -> None:
    job = f"chaos-c{os.getpid()}"
    procs = []
    try:
        with EpochSampler(jobs={job}) as sampler:
            procs += [_run(job, 1) for _ in range(3)]
            wait_for(lambda: len(sampler.seen.get((job, 1), ())) >= 3, 30, "epoch 1 seen")
            for p in procs:
                p.kill()
                p.wait()
            procs = [_run(job, 2)]
            wait_for(lambda: (job, 2) in sampler.seen, 30, "epoch 2 seen")
        assert torchrun.stale_epochs(sampler, _disk(job, 1, 2), job) == ([], 0, 0)
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_another_tests_job_of_the_same_name_is_not_a_stale_epoch(tmp_path: Path) -> None:
    """Chaos seed 11 of the second 60-fault torchrun run at 0096bbd: another test on the
    machine ran a job also named j, at epochs 4 to 12, beside this fleet's epoch 3, and every
    sample was called stale. The fleet's own processes carry its folder in their environment."""
    job, mark = f"chaos-m{os.getpid()}", str(tmp_path)
    procs = []
    try:
        with EpochSampler(jobs={job}, mark=mark.encode()) as sampler:
            procs += [_run(job, 3, HOTSPARE_FAKE_NVML=f"{mark}/nvml-a.json") for _ in range(3)]
            procs.append(_run(job, 7))  # another test's
            wait_for(lambda: len(sampler.seen.get((job, 3), ())) >= 3, 30, "epoch 3 seen")
            time.sleep(0.3)
        assert sampler.stale == [] and (job, 7) not in sampler.seen
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_a_sampler_that_saw_nothing_is_inconclusive_not_a_pass() -> None:
    sampler = EpochSampler(jobs={"j"})
    sampler.samples = 400
    bad, stale, unseen = torchrun.stale_epochs(sampler, _disk("j", 1, 2), "j")
    assert stale == 0
    assert unseen == 3, bad  # no torchrun with its workers; epochs 1 and 2 unseen
    assert all("inconclusive" in b for b in bad)


def test_an_epoch_that_trained_unseen_is_inconclusive() -> None:
    sampler = EpochSampler(jobs={"j"})
    sampler.seen[("j", 1)] = {10, 11, 12, 13}
    bad, _, unseen = torchrun.stale_epochs(sampler, _disk("j", 1, 2), "j")
    assert unseen == 1 and "epoch 2 reported steps" in bad[0], bad


def test_a_command_job_resumed_from_a_damaged_checkpoints_step_is_caught(tmp_path: Path) -> None:
    """The command kind resumes from a copy in the command's own folder (ckpt/ckpt-N.pt), not
    from the executor's checkpoints/step-N.pt that was damaged: the step names it."""
    workdir = tmp_path / "jobs" / "j"
    (workdir / "checkpoints").mkdir(parents=True)
    damaged = str(workdir / "checkpoints" / "step-0000000400.pt")

    def resumed(step: int) -> list[str]:
        ev = {"kind": "resumed", "step": step, "checkpoint": str(workdir / "ckpt" / "x.pt")}
        (workdir / "events.jsonl").write_text(json.dumps(ev) + "\n")
        f = Injected("corrupt_checkpoint", "j", "a", 0.0, ("executor_crash",))
        f.corrupted.append(("a", damaged, 0))
        return inv.corrupt_loads([f])[0]

    assert resumed(400) == [f"corrupt_checkpoint: a loaded the damaged {damaged}"]
    assert resumed(200) == []


def _progress(seen: float, step: int) -> Line:
    """A command job's progress line as its executor writes it: the rate is the command
    kind's, computed over metrics lines read in one batch (no rate at all)."""
    ev = {"kind": "progress", "epoch": 1, "step": step, "steps_per_s": 1.5e6}
    return Line(seen, "a", "j", ev)


def test_a_command_jobs_step_after_its_lease_is_judged_by_its_own_lines_not_its_rate() -> None:
    """The command kind reports ~1e6 steps/s (metrics lines read in a batch share one time):
    judged by that rate, any stale step would pass. Bounded by its last two lines (0.5 s
    apart at least: 100 steps), step 400 after the lease is caught; step 300 is not."""
    disk = DiskWatch({}, ["j"])
    disk.lines += [_progress(1.0, 100), _progress(1.6, 200), _progress(2.5, 400)]
    ends = {1: 2.0}
    assert fencing.stale_steps(disk, ends, "j") == []  # the reported rate allows anything
    bad = fencing.stale_steps(disk, ends, "j", command=True)
    assert len(bad) == 1 and "reported step 400" in bad[0], bad
    disk.lines[-1] = _progress(2.5, 300)
    assert fencing.stale_steps(disk, ends, "j", command=True) == []


def test_sigstop_past_lease_bounds_a_command_jobs_rate_from_its_progress_lines(
    tmp_path: Path,
) -> None:
    lines = [_progress(0.0, s).event for s in (1000, 1150)] + [
        {"kind": "progress", "epoch": 2, "step": 5}
    ]
    (tmp_path / "events.jsonl").write_text("".join(json.dumps(ev) + "\n" for ev in lines))
    assert _rate_bound(tmp_path, 1) == 300.0
    assert _rate_bound(tmp_path, 2) == float("inf")  # one line: no bound
