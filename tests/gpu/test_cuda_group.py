"""On a real GPU: a multi-host torch job (two executors, gloo on CUDA tensors, both on this
host's GPU) resumes bit-exact after a member is SIGKILLed; more ranks per host than GPUs is a
clear configuration fault that starts no follower."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from support.distbed import Member, finished, kill_all, serve, start, uninterrupted
from support.helpers import TINY_CONFIG, env_with

from protocol.messages import CheckpointSaved, Fault, Resumed, RunEnded
from protocol.spec import JobSpec

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here"),
]

SPEC = JobSpec(
    name="cg", steps=60, seed=5, checkpoint_every_steps=10, keep_checkpoints=5, config=TINY_CONFIG
)


@pytest.fixture
def cleanup() -> Iterator[list[Member]]:
    members: list[Member] = []
    yield members
    kill_all(members)


def test_a_cuda_group_member_killed_resumes_bit_exact(
    tmp_path: Path, cleanup: list[Member]
) -> None:
    reference = uninterrupted(tmp_path / "ref", SPEC)
    slow = env_with(HOTSPARE_INJECT="slow_write@0.01")  # killed mid-run, not after its last step
    victim, survivor = members = serve([tmp_path / "r0", tmp_path / "r1"], [slow, None])
    cleanup.extend(members)
    start(members, SPEC)
    for m in members:
        m.client.until(lambda x: isinstance(x, CheckpointSaved) and x.manifest.step == 10, 120)
    victim.proc.proc.send_signal(signal.SIGKILL)
    survivor.client.until(lambda x: isinstance(x, RunEnded), 60)
    victim.proc.finish(30)
    (again,) = serve([victim.work])
    cleanup.append(again)
    group = [again, survivor]
    start(group, SPEC, epoch=2, resume_step=10)
    for m in group:
        resumed = m.client.until(lambda x: isinstance(x, Resumed) and x.epoch == 2, 120)
        assert isinstance(resumed, Resumed) and resumed.step == 10
    assert [finished(m).params_sha256 for m in group] == [reference.digest] * 2


def test_more_ranks_per_host_than_gpus_is_a_config_fault_and_starts_no_follower(
    tmp_path: Path, cleanup: list[Member]
) -> None:
    have = torch.cuda.device_count()
    procs = have + 1
    members = serve([tmp_path / "r0", tmp_path / "r1"])
    cleanup.extend(members)
    start(members, SPEC, procs_per_host=procs)
    for m in members:
        fault = m.client.until(lambda x: isinstance(x, Fault) and x.fatal, 60)
        assert isinstance(fault, Fault) and fault.fault == "config", fault
        want = f"procs_per_host: {procs} ranks take a GPU each from cuda:0; this host has {have}"
        assert fault.message == want, fault.message
        assert not (m.work / "ranks").exists(), "no follower was started"
