"""More than one rank per host in the torch kind (``procs_per_host``, issue 31): local rank 0 in
the executor, the others in follower processes it starts for the run
(``executors.kinds.torch.local_ranks``). Real ``serve`` executors and gloo on loopback, as in
``test_dist_train``; the checks read /proc, the files on disk and the parameters' digest."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from support.distbed import (
    TIMEOUT_S,
    Member,
    Reference,
    finished,
    kill_all,
    serve,
    start,
    uninterrupted,
)
from support.helpers import TINY_CONFIG, env_with, wait_for

from executors.kinds.torch.torch_kind import PROGRESS_ENV
from protocol.messages import CheckpointSaved, Fault, Progress, Resumed, RunEnded
from protocol.spec import JobSpec

SPEC = JobSpec(
    name="lr", steps=30, seed=5, checkpoint_every_steps=10, keep_checkpoints=5, config=TINY_CONFIG
)

LONG = JobSpec(
    name="lr", steps=1_000_000, seed=5, checkpoint_every_steps=100_000, config=TINY_CONFIG
)
EVERY_STEP = env_with(**{PROGRESS_ENV: "0"})


@pytest.fixture
def cleanup() -> Iterator[list[Member]]:
    members: list[Member] = []
    yield members
    kill_all(members)


@pytest.fixture(scope="module")
def four_hosts(tmp_path_factory: pytest.TempPathFactory) -> Reference:
    """The uninterrupted run of SPEC on four hosts of one rank each."""
    return uninterrupted(tmp_path_factory.mktemp("ref"), SPEC, hosts=4)


def test_two_hosts_of_two_ranks_train_as_four_hosts_of_one(
    tmp_path: Path, four_hosts: Reference, cleanup: list[Member]
) -> None:
    members = serve([tmp_path / "r0", tmp_path / "r1"])
    cleanup.extend(members)
    start(members, SPEC, procs_per_host=2)
    digests = {finished(m).params_sha256 for m in members}
    assert digests == {four_hosts.digest}


def followers(executor: int) -> list[psutil.Process]:
    """The executor's local ranks, from /proc: its children running ``rank_process``."""
    try:
        kids = psutil.Process(executor).children()
    except psutil.NoSuchProcess:
        return []
    return [k for k in kids if "executors.kinds.torch.rank_process" in " ".join(_cmd(k))]


def _cmd(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except psutil.Error:
        return []


def gone(p: psutil.Process) -> bool:
    """Not running any more (gone, or a zombie nobody has reaped yet)."""
    try:
        return p.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_killed_executor_takes_its_local_ranks_and_the_group_resumes_bit_exact(
    tmp_path: Path, four_hosts: Reference, cleanup: list[Member]
) -> None:
    """SIGKILL of one member's executor mid-run: its follower dies with it (no rank of that
    epoch trains on: torchrun's workers outlived it), the other member's run ends as a crash
    within the collective timeout and its follower ends too; both resume at step 10 and end
    bit-exact with four hosts of one rank (each follower's own RNG states restored)."""
    slow = env_with(HOTSPARE_INJECT="slow_write@0.01")  # killed mid-run, not after its last step
    victim, survivor = members = serve([tmp_path / "r0", tmp_path / "r1"], [slow, None])
    cleanup.extend(members)
    start(members, SPEC, procs_per_host=2)
    for m in members:
        m.client.until(lambda x: isinstance(x, CheckpointSaved) and x.manifest.step == 10, 60)
    (lost,) = followers(victim.proc.proc.pid)
    (other,) = followers(survivor.proc.proc.pid)
    lost.send_signal(signal.SIGSTOP)  # not in a collective with it: only its parent-death signal
    victim.proc.proc.send_signal(signal.SIGKILL)
    killed_at = time.monotonic()
    wait_for(lambda: gone(lost), 10, "the killed executor's local rank gone")
    ended = survivor.client.until(lambda x: isinstance(x, RunEnded), TIMEOUT_S + 10)
    assert time.monotonic() - killed_at < TIMEOUT_S + 10
    assert isinstance(ended, RunEnded) and ended.fault == "crash", ended
    wait_for(lambda: gone(other), 10, "the survivor's local rank ended with its run")
    victim.proc.finish(30)

    (again,) = serve([victim.work])
    cleanup.append(again)
    members = [again, survivor]
    start(members, SPEC, epoch=2, resume_step=10, procs_per_host=2)
    for m in members:
        resumed = m.client.until(lambda x: isinstance(x, Resumed) and x.epoch == 2, 60)
        assert isinstance(resumed, Resumed) and resumed.step == 10
    assert {finished(m).params_sha256 for m in members} == {four_hosts.digest}


def test_a_follower_ignores_sigterm_and_its_death_fails_the_run_saying_which(
    tmp_path: Path, cleanup: list[Member]
) -> None:
    """A preemption's SIGTERM to a follower does not end it (a stop reaches it by the agreement);
    a SIGKILL does, and its member's run ends as a crash whose message names the local rank."""
    members = serve([tmp_path / "r0", tmp_path / "r1"], [EVERY_STEP, EVERY_STEP])
    cleanup.extend(members)
    start(members, LONG, procs_per_host=2)
    _, second = members
    second.client.until(lambda x: isinstance(x, Progress) and x.step >= 3, 60)
    (follower,) = followers(second.proc.proc.pid)
    follower.send_signal(signal.SIGTERM)
    follower.send_signal(signal.SIGINT)
    now = max(x.step for x in second.client.seen if isinstance(x, Progress))
    second.client.until(lambda x: isinstance(x, Progress) and x.step >= now + 10, 60)
    assert not gone(follower), "a follower ended on SIGTERM"
    follower.send_signal(signal.SIGKILL)
    ended = second.client.until(lambda x: isinstance(x, RunEnded), TIMEOUT_S + 10)
    assert isinstance(ended, RunEnded) and ended.fault == "crash", ended
    said = [x.message for x in second.client.seen if isinstance(x, Fault)]
    assert any(f"local rank 1 (pid {follower.pid}) was killed by signal 9" in s for s in said), said
