"""Bit-exact resume restores every RNG a step draws from: Python's, numpy's and torch's.

The workload (tests/workload_rngs.py) perturbs each loss by one draw from each global RNG.
An executor SIGKILLed after a checkpoint and run again ends with the uninterrupted run's
parameters, the digest computed here from the final checkpoint's tensors; another seed gives
another digest (the digest sees the parameters).
"""

from __future__ import annotations

import hashlib
import signal
from pathlib import Path

import pytest
import torch
from support.helpers import REPO, ExecutorProcess, env_with, run_job, write_spec

STEPS = 60
ENV = env_with(PYTHONPATH=f"{REPO}:{REPO / 'tests'}")
"""The workload is a module of tests/."""


def spec(folder: Path, seed: int = 3) -> Path:
    return write_spec(
        folder / "job.toml", workload="workload_rngs:factory", steps=STEPS, seed=seed, config={}
    )


def digest(work: Path) -> str:
    """sha256 over the final checkpoint's model tensors, loaded here (weights_only)."""
    (manifest,) = (work / "checkpoints").glob(f"step-{STEPS:010d}.json")
    state = torch.load(manifest.with_suffix(".pt"), weights_only=True)
    h = hashlib.sha256()
    for name, t in sorted(state["workload"]["model"].items()):
        h.update(name.encode())
        h.update(t.contiguous().numpy().tobytes())
    return h.hexdigest()


@pytest.mark.long  # the suite's bit-exact resumes train with dropout, so a wrong RNG changes params_sha256 (test_run)
def test_a_sigkilled_run_resumes_every_rng_bit_exact(tmp_path: Path) -> None:
    job = spec(tmp_path)
    assert run_job(job, tmp_path / "base", env=ENV).returncode == 0
    (tmp_path / "other").mkdir()
    other = spec(tmp_path / "other", seed=4)
    assert run_job(other, tmp_path / "other" / "w", env=ENV).returncode == 0
    assert digest(tmp_path / "other" / "w") != digest(tmp_path / "base"), "the digest sees params"

    work = tmp_path / "w"
    first = ExecutorProcess(["run", "--spec", str(job), "--workdir", str(work), "--json"], env=ENV)
    first.wait_event(
        lambda e: e["kind"] == "checkpoint" and e["manifest"]["step"] >= 20, 60, "step 20 saved"
    )
    first.proc.send_signal(signal.SIGKILL)
    rc, _ = first.finish()
    assert rc == -signal.SIGKILL
    again = run_job(job, work, env=ENV)
    assert again.returncode == 0, again.stderr
    resumed = again.of("resumed")[0]["step"]
    assert 0 < resumed < STEPS, "it resumed from a checkpoint, mid-run"
    assert digest(work) == digest(tmp_path / "base")
