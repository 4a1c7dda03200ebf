"""On a real GPU: CUDA training is deterministic, and a SIGKILLed run resumes bit-exact."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import torch
from support.helpers import ExecutorProcess, write_spec

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here"),
]


def test_cuda_run_killed_twice_resumes_bit_exact(tmp_path: Path) -> None:
    spec = write_spec(
        tmp_path / "job.toml",
        steps=300,
        checkpoint_every_steps=25,
        config={"n_layer": 2, "n_embd": 128, "block_size": 64, "global_batch": 32},
    )
    args = ["--device", "cuda"]
    baseline = ExecutorProcess(
        ["run", "--spec", str(spec), "--workdir", str(tmp_path / "base"), "--json", *args]
    )
    assert baseline.finish(300)[0] == 0, baseline.stderr
    digest = baseline.events[-1]["params_sha256"]
    work = tmp_path / "work"
    for target in (60, 170):
        proc = ExecutorProcess(
            ["run", "--spec", str(spec), "--workdir", str(work), "--json", *args]
        )
        proc.wait_event(
            lambda e, t=target: e["kind"] == "progress" and e["step"] >= t, 300, f"step {target}"
        )
        proc.proc.send_signal(signal.SIGKILL)
        proc.finish()
    final = ExecutorProcess(["run", "--spec", str(spec), "--workdir", str(work), "--json", *args])
    assert final.finish(300)[0] == 0, final.stderr
    assert final.of("resumed")[0]["step"] > 0
    assert final.events[-1]["params_sha256"] == digest
