"""``parallel = "fsdp"`` (issue 31): the torch kind shards the model over a group's members and
each member checkpoints its part through torch.distributed.checkpoint.

Real ``serve`` executors and real gloo on loopback, as in ``test_dist_train`` (its helpers,
in ``support.distbed``). The checks read the parts on disk (their files and sizes), the events
and the final parameters' digest, not the executors' account of themselves.
"""

from __future__ import annotations

import pickle
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
from support.distbed import (
    Member,
    Reference,
    finished,
    kill_all,
    manifests,
    serve,
    start,
    uninterrupted,
)
from support.helpers import TINY_CONFIG, env_with

from executors import exitcodes
from executors.fencing.publish import CorruptCheckpoint, checkpoint_name
from executors.kinds.torch.sharded import METADATA, TRAINER, read_metadata
from executors.kinds.torch.torch_kind import PROGRESS_ENV
from protocol.messages import CheckpointSaved, Fault, Progress, Resumed, RunEnded, Start
from protocol.spec import JobSpec

SPEC = JobSpec(
    name="fs",
    steps=30,
    seed=5,
    checkpoint_every_steps=10,
    keep_checkpoints=5,
    parallel="fsdp",
    config={**TINY_CONFIG, "n_layer": 2},
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
def reference(tmp_path_factory: pytest.TempPathFactory) -> Reference:
    """One uninterrupted 2-rank FSDP run of SPEC."""
    return uninterrupted(tmp_path_factory.mktemp("ref"), SPEC)


def part(work: Path, step: int) -> Path:
    return work / "checkpoints" / f"{checkpoint_name(step)}.pt"


def test_each_member_writes_its_part_and_a_copy_of_the_previous_members(
    reference: Reference,
) -> None:
    for rank, work in enumerate(reference.works):
        saved = manifests(work)
        assert [m.step for m in saved] == [10, 20, 30]
        for m in saved:
            assert (m.node_rank, m.nnodes) == (rank, 2)
            assert m.files is not None
            names = sorted(f.path for f in m.files)
            own, previous = f"__{rank}_0.distcp", f"__{1 - rank}_0.distcp"
            assert names == sorted([METADATA, own, previous, TRAINER]), names
            on_disk = {p.name: p.stat().st_size for p in part(work, m.step).iterdir()}
            assert on_disk == {f.path: f.size for f in m.files}
    # the two ranks' data files hold different shares of the state, neither most of it
    a, b = (part(w, 30) / f"__{r}_0.distcp" for r, w in enumerate(reference.works))
    assert a.read_bytes() != b.read_bytes()
    total = a.stat().st_size + b.stat().st_size
    assert max(a.stat().st_size, b.stat().st_size) < 0.6 * total
    copies = (part(w, 30) / f"__{1 - r}_0.distcp" for r, w in enumerate(reference.works))
    assert [c.read_bytes() for c in copies] == [b.read_bytes(), a.read_bytes()]
    meta = [(part(w, 30) / METADATA).read_bytes() for w in reference.works]
    assert meta[0] == meta[1], "every member holds the same index of the step"


def test_a_rank_0_replaced_with_its_part_resumes_bit_exact(
    tmp_path: Path, reference: Reference, cleanup: list[Member]
) -> None:
    victim, survivor = members = serve([tmp_path / "r0", tmp_path / "r1"])
    cleanup += members
    start(members, SPEC)
    for m in members:
        m.client.until(lambda x: isinstance(x, CheckpointSaved) and x.manifest.step == 10, 60)
    victim.proc.proc.send_signal(signal.SIGKILL)
    survivor.client.until(lambda x: isinstance(x, RunEnded), 30)
    victim.proc.finish(30)
    # the console promotes rank 0's replica on a spare: its part of step 10, and nothing else
    spare = tmp_path / "spare"
    (spare / "checkpoints").mkdir(parents=True)
    name = checkpoint_name(10)
    shutil.copytree(part(victim.work, 10), spare / "checkpoints" / f"{name}.pt")
    shutil.copy(victim.work / "checkpoints" / f"{name}.json", spare / "checkpoints")
    (fresh,) = serve([spare])
    cleanup.append(fresh)
    group = [fresh, survivor]
    start(group, SPEC, epoch=2, resume_step=10)
    for m in group:
        resumed = m.client.until(lambda x: isinstance(x, Resumed) and x.epoch == 2, 60)
        assert isinstance(resumed, Resumed) and resumed.step == 10
    assert [finished(m).params_sha256 for m in group] == [reference.digest] * 2


def copy_step(reference: Reference, works: list[Path], step: int) -> None:
    for src, dst in zip(reference.works, works, strict=True):
        (dst / "checkpoints").mkdir(parents=True)
        for p in (src / "checkpoints").glob(f"{checkpoint_name(step)}*"):
            (shutil.copytree if p.is_dir() else shutil.copy)(p, dst / "checkpoints" / p.name)


def tear(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def test_a_torn_shard_file_is_never_loaded_its_copy_on_the_next_member_is(
    tmp_path: Path, reference: Reference, cleanup: list[Member]
) -> None:
    works = [tmp_path / "r0", tmp_path / "r1"]
    copy_step(reference, works, 10)
    tear(part(works[1], 10) / "__1_0.distcp")
    members = serve(works)
    cleanup += members
    start(members, SPEC, epoch=2, resume_step=10)
    fault = members[1].client.until(lambda x: isinstance(x, Fault), 60)
    assert isinstance(fault, Fault) and fault.fault == "checkpoint_corrupt" and not fault.fatal
    assert "__1_0.distcp: size" in fault.message, fault.message
    for m in members:
        resumed = m.client.until(lambda x: isinstance(x, Resumed) and x.epoch == 2, 60)
        assert isinstance(resumed, Resumed) and resumed.step == 10
    assert [finished(m).params_sha256 for m in members] == [reference.digest] * 2


def test_a_shard_torn_on_every_member_that_holds_it_is_never_loaded(
    tmp_path: Path, reference: Reference, cleanup: list[Member]
) -> None:
    works = [tmp_path / "r0", tmp_path / "r1"]
    copy_step(reference, works, 10)
    tear(part(works[1], 10) / "__1_0.distcp")
    tear(part(works[0], 10) / "__1_0.distcp")  # rank 0's copy of it
    members = serve(works)
    cleanup += members
    start(members, SPEC, epoch=2, resume_step=10)
    for m in members:
        fault = m.client.until(lambda x: isinstance(x, Fault) and x.fatal, 60)
        assert isinstance(fault, Fault) and fault.fault == "resume_failed", fault
        assert "no rank holds __1_0.distcp" in fault.message, fault.message
        ended = m.client.until(lambda x: isinstance(x, RunEnded), 30)
        assert isinstance(ended, RunEnded) and ended.fault == "resume_failed", ended
        assert not any(isinstance(x, (Resumed, Progress)) for x in m.client.seen)


class _Boom:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (print, ("pwned",))


def test_dcp_metadata_that_would_run_code_is_refused(reference: Reference) -> None:
    good = (part(reference.works[0], 10) / METADATA).read_bytes()
    assert read_metadata(good).storage_data
    for bad in (pickle.dumps(_Boom()), pickle.dumps({"a": 1}), b"not a pickle"):
        with pytest.raises(CorruptCheckpoint):
            read_metadata(bad)


# ------------------------------------------------------------------ elastic: resharded


LOGICAL = 3
ELASTIC = msgspec.structs.replace(
    SPEC,
    name="fse",
    steps=24,
    checkpoint_every_steps=8,
    config={**SPEC.config, "global_batch": 12, "micro_batch": 2},
)
PHASES = ((3, 8), (2, 16), (3, 24))
"""(members, last step) of each epoch: full size, shrunk to 2, grown back to 3."""
LOSS_RTOL = 1e-5
"""How far the losses may drift from the uninterrupted run's after the world size changed:
only the order of the reduce-scatter's sums differs (and the losses' scale by 2/3 on 2
ranks). Measured worst case: 1.06e-7 relative (the test prints it with ``-s``)."""


def run_phase(members: list[Member], last: int, *, epoch: int, resume: int | None) -> None:
    spec = msgspec.structs.replace(ELASTIC, steps=last)
    start(members, spec, epoch=epoch, resume_step=resume, logical_ranks=LOGICAL)
    for m in members:
        finished(m)
        rc, err = m.proc.finish(30)
        assert rc == exitcodes.OK, err


def losses(m: Member) -> dict[int, float]:
    return {x.step: x.loss for x in m.client.seen if isinstance(x, Progress) and x.step > 0}


def test_a_shrink_and_a_grow_reshard_the_committed_step_and_follow_the_reference(
    tmp_path: Path, cleanup: list[Member]
) -> None:
    ref = serve([tmp_path / "ref" / f"r{i}" for i in range(3)], [EVERY_STEP] * 3)
    cleanup += ref
    run_phase(ref, ELASTIC.steps, epoch=1, resume=None)
    want = losses(ref[0])

    works = [tmp_path / f"w{i}" for i in range(3)]
    first = serve(works, [EVERY_STEP] * 3)
    cleanup += first
    run_phase(first, PHASES[0][1], epoch=1, resume=None)
    shutil.rmtree(works[1])  # its host is gone: its shards live on only as w2's copy of them

    shrunk = serve([works[0], works[2]], [EVERY_STEP] * 2)
    cleanup += shrunk
    run_phase(shrunk, PHASES[1][1], epoch=2, resume=PHASES[0][1])
    for rank, w in enumerate((works[0], works[2])):
        (m16,) = [m for m in manifests(w) if m.step == 16]
        assert (m16.node_rank, m16.nnodes) == (rank, 2)
        assert m16.files is not None
        assert {f.path for f in m16.files} >= {f"__{rank}_0.distcp", f"__{1 - rank}_0.distcp"}

    new = tmp_path / "w3"  # a host added, with nothing on it: every shard comes from the others
    grown = serve([works[2], new, works[0]], [EVERY_STEP] * 3)
    cleanup += grown
    run_phase(grown, PHASES[2][1], epoch=3, resume=PHASES[1][1])

    got: dict[int, float] = {}
    for members in (first, shrunk, grown):
        got.update(losses(members[0]))
    assert sorted(got) == sorted(want) == list(range(1, ELASTIC.steps + 1))
    worst = max(abs(got[s] - want[s]) / abs(want[s]) for s in got)
    print(f"worst relative loss difference after resharding: {worst:.2e}")
    assert worst <= LOSS_RTOL, f"worst relative loss difference {worst:.2e}"
    resumed = next(x for x in grown[1].client.seen if isinstance(x, Resumed))
    assert resumed.step == 16


def test_fsdp_on_one_host_is_a_config_fault_naming_the_key(
    tmp_path: Path, cleanup: list[Member]
) -> None:
    (alone,) = serve([tmp_path / "r0"])
    cleanup.append(alone)
    alone.client.send(Start(spec=SPEC, epoch=1))
    fault = alone.client.until(lambda x: isinstance(x, Fault) and x.fatal, 60)
    assert isinstance(fault, Fault) and fault.fault == "config", fault
    assert fault.message.startswith("parallel: fsdp shards the model over a multi-host job's")
    assert not any(isinstance(x, (Resumed, Progress)) for x in alone.client.seen)
