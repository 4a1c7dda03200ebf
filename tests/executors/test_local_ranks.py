"""More than one rank per host in the torch kind (``procs_per_host``, issue 31): local rank 0 in
the executor, the others in follower processes it starts for the run
(``executors.kinds.torch.local_ranks``). Real ``serve`` executors and gloo on loopback, as in
``test_dist_train``; the checks read /proc, the files on disk and the parameters' digest."""

from __future__ import annotations

import hashlib
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import psutil
import pytest
import torch
from support.distbed import (
    TIMEOUT_S,
    Member,
    Reference,
    finished,
    kill_all,
    manifests,
    serve,
    start,
    uninterrupted,
)
from support.helpers import TINY_CONFIG, env_with, wait_for

from executors.fencing.publish import checkpoint_name
from executors.kinds.torch.sharded import METADATA, TRAINER
from executors.kinds.torch.torch_kind import PROGRESS_ENV
from protocol.messages import CheckpointSaved, Fault, Progress, Resumed, RunEnded, Stopped
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


# the module-wide reference is made once, on the one worker that runs the whole module
pytestmark = pytest.mark.xdist_group(__name__)


@pytest.fixture(scope="module")
def four_hosts(tmp_path_factory: pytest.TempPathFactory) -> Reference:
    """The uninterrupted run of SPEC on four hosts of one rank each."""
    return uninterrupted(tmp_path_factory.mktemp("ref"), SPEC, hosts=4)


@pytest.mark.long  # the suite ends two hosts of two ranks bit-exact with four of one after a
# kill and a resume (test_a_killed_executor_takes_its_local_ranks_..., below)
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


# ------------------------------------------------------------------ sharded (FSDP2)

FSDP = msgspec.structs.replace(
    SPEC, name="lrf", parallel="fsdp", config={**TINY_CONFIG, "n_layer": 2}
)


def hashed(path: Path) -> tuple[int, str]:
    data = path.read_bytes()
    return len(data), hashlib.sha256(data).hexdigest()


def test_a_sharded_host_of_two_ranks_writes_one_part_and_resumes_it_bit_exact(
    tmp_path: Path, cleanup: list[Member]
) -> None:
    """FSDP over two hosts of two ranks (its uninterrupted run here). Each host's part of a
    step is one folder: its two ranks' DCP files, a copy of the other host's two, the index and
    one trainer state holding both ranks' RNG states; its manifest lists exactly what is on
    disk (hashed here). Those parts alone, in fresh workdirs, resume bit-exact."""
    works = [tmp_path / "r0", tmp_path / "r1"]
    members = serve(works)
    cleanup.extend(members)
    start(members, FSDP, procs_per_host=2)
    (digest,) = {finished(m).params_sha256 for m in members}
    for node, work in enumerate(works):
        (m10,) = [m for m in manifests(work) if m.step == 10]
        assert (m10.node_rank, m10.nnodes) == (node, 2) and m10.files is not None
        folder = work / "checkpoints" / f"{checkpoint_name(10)}.pt"
        own = {f"__{2 * node + k}_0.distcp" for k in range(2)}
        other = {f"__{2 * (1 - node) + k}_0.distcp" for k in range(2)}
        on_disk = {p.name: hashed(p) for p in folder.iterdir()}
        assert set(on_disk) == own | other | {METADATA, TRAINER}
        assert on_disk == {f.path: (f.size, f.sha256) for f in m10.files}
        trainer = torch.load(folder / TRAINER, weights_only=True)
        assert len(trainer["rng_local"]) == 2
        local = [s["torch"] for s in trainer["rng_local"]]
        assert not torch.equal(local[0], local[1]), "each local rank's own RNG state"
        assert torch.equal(trainer["rng"]["torch"], local[0])

    fresh = [tmp_path / "f0", tmp_path / "f1"]
    for src, dst in zip(works, fresh, strict=True):
        (dst / "checkpoints").mkdir(parents=True)
        for p in (src / "checkpoints").glob(f"{checkpoint_name(10)}*"):
            (shutil.copytree if p.is_dir() else shutil.copy)(p, dst / "checkpoints" / p.name)
    again = serve(fresh)
    cleanup.extend(again)
    start(again, FSDP, epoch=2, resume_step=10, procs_per_host=2)
    for m in again:
        resumed = m.client.until(lambda x: isinstance(x, Resumed) and x.epoch == 2, 60)
        assert isinstance(resumed, Resumed) and resumed.step == 10
    assert {finished(m).params_sha256 for m in again} == {digest}


ELASTIC = msgspec.structs.replace(
    FSDP, name="lre", steps=24, checkpoint_every_steps=8, config={**FSDP.config, "global_batch": 8}
)
LOGICAL = 4
LOSS_RTOL = 1e-5
"""As in ``test_fsdp_train``: only the order of the reduce-scatter's sums differs after a
world-size change."""


def phase(members: list[Member], last: int, *, epoch: int, resume: int | None) -> None:
    spec = msgspec.structs.replace(ELASTIC, steps=last)
    start(members, spec, epoch=epoch, resume_step=resume, logical_ranks=LOGICAL, procs_per_host=2)
    for m in members:
        finished(m)


def losses(m: Member) -> dict[int, float]:
    return {x.step: x.loss for x in m.client.seen if isinstance(x, Progress) and x.step > 0}


@pytest.mark.long  # the suite proves elastic FSDP resharding at one rank per host
# (test_fsdp_train) and the part of a host of two ranks here
def test_a_sharded_job_of_two_ranks_per_host_shrinks_to_one_host_and_grows_back_resharded(
    tmp_path: Path, cleanup: list[Member]
) -> None:
    """Elastic FSDP, two ranks per host: 2 hosts (4 ranks) -> 1 host (2 ranks) with the other's
    workdir gone (its shards live on as the ring copies on the first) -> 2 hosts, the new one
    empty. Each epoch loads the committed step resharded; the losses follow the uninterrupted
    run's within LOSS_RTOL."""
    ref = serve([tmp_path / "ref0", tmp_path / "ref1"], [EVERY_STEP] * 2)
    cleanup.extend(ref)
    phase(ref, ELASTIC.steps, epoch=1, resume=None)
    want = losses(ref[0])

    works = [tmp_path / "w0", tmp_path / "w1"]
    first = serve(works, [EVERY_STEP] * 2)
    cleanup.extend(first)
    phase(first, 8, epoch=1, resume=None)
    kill_all(first)
    shutil.rmtree(works[1])
    (alone,) = serve([works[0]], [EVERY_STEP])
    cleanup.append(alone)
    phase([alone], 16, epoch=2, resume=8)
    kill_all([alone])
    grown = serve([works[0], tmp_path / "w2"], [EVERY_STEP] * 2)
    cleanup.extend(grown)
    phase(grown, 24, epoch=3, resume=16)

    got: dict[int, float] = {}
    for leader in (first[0], alone, grown[0]):
        got.update(losses(leader))
    assert sorted(got) == sorted(want) == list(range(1, ELASTIC.steps + 1))
    worst = max(abs(got[s] - want[s]) / abs(want[s]) for s in got)
    print(f"worst relative loss difference after resharding: {worst:.2e}")
    assert worst <= LOSS_RTOL, f"worst relative loss difference {worst:.2e}"
    resumed = [x.step for x in grown[1].client.seen if isinstance(x, Resumed)]
    assert resumed == [16], resumed


def test_a_preemptions_sigterm_to_a_member_and_its_follower_checkpoints_every_rank_at_one_step(
    tmp_path: Path, cleanup: list[Member]
) -> None:
    """SIGTERM to one member's executor and its follower (as to their process group): the
    follower ignores it, the executor asks the stop, and both members' four ranks stop at one
    step with that step checkpointed (a follower that died of the SIGTERM would have failed the
    run as a crash, with no checkpoint)."""
    works = [tmp_path / "r0", tmp_path / "r1"]
    members = serve(works, [EVERY_STEP] * 2)
    cleanup.extend(members)
    start(members, LONG, procs_per_host=2)
    _, second = members
    second.client.until(lambda x: isinstance(x, Progress) and x.step >= 3, 60)
    (follower,) = followers(second.proc.proc.pid)
    follower.send_signal(signal.SIGTERM)
    second.proc.proc.send_signal(signal.SIGTERM)
    stopped = [m.client.until(lambda x: isinstance(x, (Stopped, RunEnded)), 60) for m in members]
    assert all(isinstance(s, Stopped) for s in stopped), stopped
    steps = {s.step for s in stopped if isinstance(s, Stopped)}
    (step,) = steps
    assert [s.checkpoint_step for s in stopped if isinstance(s, Stopped)] == [step, step]
    assert [s.reason for s in stopped if isinstance(s, Stopped)] == ["peer_stopped", "preempted"]
    for w in works:
        assert step in {m.step for m in manifests(w)}, "that step is on disk on both members"
    wait_for(lambda: gone(follower), 30, "the follower ended with its run")


def test_local_rank_0s_own_crash_is_said_as_such_not_blamed_on_its_follower(
    tmp_path: Path, cleanup: list[Member]
) -> None:
    """Local rank 0's run raises at step 5: its follower then fails too (its group is gone), but
    the crash said is local rank 0's own, and the follower is ended."""
    crash = env_with(HOTSPARE_INJECT="crash@5")
    members = serve([tmp_path / "r0", tmp_path / "r1"], [None, crash])
    cleanup.extend(members)
    start(members, LONG, procs_per_host=2)
    _, second = members
    ended = second.client.until(lambda x: isinstance(x, RunEnded), 90)  # joins and 5 steps
    assert isinstance(ended, RunEnded) and ended.fault == "crash", ended
    said = [x.message for x in second.client.seen if isinstance(x, Fault)]
    assert any("injected crash at step 5" in s for s in said), said
    assert not any("local rank" in s for s in said), said
    wait_for(lambda: not followers(second.proc.proc.pid), 30, "the follower ended")
