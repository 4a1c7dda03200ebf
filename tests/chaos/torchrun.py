"""Torchrun jobs in the chaos fleet: a ``command`` job that runs ``torchrun --standalone
--nproc-per-node 2`` over tests/train_ddp_plain.py, which logs only to a metrics file, so no
EPIPE ends a worker whose executor is gone: only the run's fence does.

What the harness reads of such a job besides what it reads of a torch job:

- its final parameters, hashed here from the final checkpoint's bytes (model and optimizer
  tensors, as tests/console/supervise/test_fence_torchrun.py does): the command kind's own
  params_sha256 is the sha256 of the checkpoint file, whose pickled layout differs after a
  resume although every tensor is equal;
- its processes by the epoch in their environment (/proc, ``chaos.epochs``): none of an
  ended epoch once a process of the next one exists; and that the sampler looked (every
  epoch that reported a step was seen, one with torchrun and its workers), else the run is
  inconclusive: counted, and a violation, never a silent pass.

Its uninterrupted run (the baseline) runs under another job name (``BASELINE_PREFIX``), so
the sampler, which knows a process only by the job and epoch in its environment, never takes
the baseline's processes for a stale epoch of the job.
"""

from __future__ import annotations

import hashlib
import sys
import time
from pathlib import Path
from typing import Any

from support.helpers import REPO

from chaos.disk import DiskWatch
from chaos.epochs import SAMPLE_S, EpochSampler, Stale

KIND = "torchrun"
WORKERS = 2
SCRIPT = REPO / "tests" / "train_ddp_plain.py"
METRICS = "metrics.jsonl"
CHECKPOINT_DIR = "ckpt"
BASELINE_PREFIX = "baseline-"
GAP_S = 3 * SAMPLE_S
"""Stale samples closer than this make one interval in a violation's line."""


def command_table(save_every: int) -> dict[str, Any]:
    """The job's ``[command]`` table: torchrun, 2 workers, checkpoints every ``save_every``."""
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    argv += ["--nproc-per-node", str(WORKERS), str(SCRIPT)]
    argv += ["--checkpoint-dir", "{checkpoint_dir}", "--resume", "{resume_from}"]
    argv += ["--steps", "{steps}", "--save-every", str(save_every), "--seed", "{seed}"]
    argv += ["--metrics-file", METRICS]
    return {
        "argv": argv,
        "env": {"OMP_NUM_THREADS": "1"},
        "checkpoint_dir": CHECKPOINT_DIR,
        "checkpoint_glob": "ckpt-*.pt",
        "complete_marker": "{name}.done",
        "metrics_file": METRICS,
        "grace_s": 1.0,
    }


def final_checkpoint(workdir: Path, steps: int) -> Path:
    return workdir / CHECKPOINT_DIR / f"ckpt-{steps}.pt"


def state_sha256(path: Path) -> str:
    """sha256 over the checkpoint's model tensors, then its optimizer's state tensors and step,
    as loaded here (weights_only)."""
    import torch

    ck = torch.load(path, weights_only=True)
    h = hashlib.sha256()
    for name, t in ck["model"].items():
        h.update(name.encode())
        h.update(t.contiguous().numpy().tobytes())
    for index, state in sorted(ck["optimizer"]["state"].items()):
        for name, t in sorted(state.items()):
            h.update(f"{index}.{name}".encode())
            h.update(t.contiguous().numpy().tobytes())
    h.update(str(ck["step"]).encode())
    return h.hexdigest()


def finished(
    finished_on: dict[str, str], workdir: Any, job: str, steps: int, want: str
) -> list[str]:
    """The job finished, and its final checkpoint on the host it finished on holds the
    uninterrupted run's state. ``finished_on``: job -> host of its Finished event;
    ``workdir(host, job)``: the job's folder on a host."""
    host = finished_on.get(job)
    if host is None:
        return [f"job {job} did not finish"]
    path = final_checkpoint(workdir(host, job), steps)
    try:
        got = state_sha256(path)
    except (OSError, RuntimeError, KeyError) as e:
        return [f"job {job}: its final checkpoint {path} on {host} cannot be read: {e}"]
    if got != want:
        return [f"job {job}: final state sha256 {got} ({path}) != uninterrupted run's {want}"]
    return []


def stale_epochs(sampler: EpochSampler, disk: DiskWatch, job: str) -> tuple[list[str], int, int]:
    """(violations, stale samples, inconclusive): no sample in which a process of an older
    epoch lived beside one of a newer epoch; the sampler saw every epoch that reported a step
    (its executor's progress lines), and one epoch with torchrun and its workers."""
    offset = time.time() - time.monotonic()
    stale = [s for s in sampler.stale if s.job == job]
    out = [_stale_line(job, run, offset) for run in _intervals(stale)]
    trained = sorted(
        {
            int(ln.event.get("epoch", 0))
            for ln in disk.lines
            if ln.job == job and ln.event.get("kind") == "progress"
        }
    )
    inconclusive = []
    most = max((len(p) for (j, _), p in sampler.seen.items() if j == job), default=0)
    if most < WORKERS + 1:
        inconclusive.append(
            f"{job}: inconclusive: /proc never showed torchrun and its {WORKERS} workers in one "
            f"epoch (at most {most} processes in {sampler.samples} samples): is it looking?"
        )
    for epoch in trained:
        if (job, epoch) not in sampler.seen:
            inconclusive.append(
                f"{job}: inconclusive: epoch {epoch} reported steps, but /proc never showed a "
                f"process of it ({sampler.samples} samples)"
            )
    return out + inconclusive, len(stale), len(inconclusive)


def _intervals(stale: list[Stale]) -> list[list[Stale]]:
    runs: list[list[Stale]] = []
    for s in stale:
        if runs and s.t - runs[-1][-1].t <= GAP_S and s.newest == runs[-1][-1].newest:
            runs[-1].append(s)
        else:
            runs.append([s])
    return runs


def _stale_line(job: str, run: list[Stale], offset: float) -> str:
    old = sorted({pe for s in run for pe in s.old})
    return (
        f"{job}: processes of an ended epoch lived beside epoch {run[0].newest}'s from "
        f"{run[0].t + offset:.3f} to {run[-1].t + offset:.3f} ({len(run)} samples, /proc): "
        + ", ".join(f"pid {p} (epoch {e})" for p, e in old)
    )
