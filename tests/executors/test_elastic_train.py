"""Elastic multi-host jobs (issue 16): a job of 3 logical ranks trains on 3, 2, then 3 members.

Real ``serve`` executors and real gloo on loopback, as in ``test_dist_train`` (its helpers,
in ``support.distbed``). A shrunk group renumbers its members, so a member loads a shard
another node rank wrote at another group size; a grown one gives its new member a copy of a
shard, as the console promotes a replica. The checks read the checkpoints on disk and the events.
"""

from __future__ import annotations

import hashlib
import math
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pytest
import torch
from support.distbed import Member, finished, kill_all, manifests, serve, start
from support.helpers import TINY_CONFIG, env_with

from executors import exitcodes
from executors.fencing.publish import checkpoint_name
from executors.kinds.torch.dist import check
from executors.kinds.torch.logical import Layout, block, plan
from executors.kinds.torch.torch_kind import PROGRESS_ENV
from protocol.errors import ConfigError
from protocol.messages import Finished, Log, Progress, Rendezvous, Resumed
from protocol.spec import JobSpec

LOGICAL = 3
SPEC = JobSpec(
    name="elastic",
    steps=24,
    seed=11,
    checkpoint_every_steps=8,
    keep_checkpoints=5,
    config={**TINY_CONFIG, "global_batch": 12, "micro_batch": 2},
)
PHASES = ((3, 8), (2, 16), (3, 24))
"""(members, last step) of each epoch: full size, shrunk to 2, grown back to 3."""
LOSS_RTOL = 1e-5
"""How far the plain all-reduce's losses may drift from the uninterrupted run's after the world
size changed (only the order of a sum differs, so only the last bits, and what they grow into).
Measured worst case: 1.5e-7 relative, at step 22 of 24; steps 1-14 were equal."""
EVERY_STEP = env_with(**{PROGRESS_ENV: "0"})


def checkpoint(work: Path, step: int) -> Path:
    return work / "checkpoints" / f"{checkpoint_name(step)}.pt"


def state_digest(work: Path, step: int) -> str:
    """sha256 over a checkpoint's model, optimizer and data position, read from the file."""
    state = torch.load(checkpoint(work, step), weights_only=True)
    h = hashlib.sha256()

    def walk(at: str, obj: Any) -> None:
        if isinstance(obj, torch.Tensor):
            t = obj.detach().contiguous()
            h.update(f"{at}|{t.dtype}|{tuple(t.shape)}\n".encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
        elif isinstance(obj, dict):
            for k in sorted(obj, key=str):
                walk(f"{at}/{k}", obj[k])
        elif isinstance(obj, (list, tuple)):
            for i, v in enumerate(obj):
                walk(f"{at}/{i}", v)
        else:
            h.update(f"{at}={obj!r}\n".encode())

    walk("model", state["workload"]["model"])
    walk("optimizer", state["workload"]["optimizer"])
    walk("data", {k: state["train"][k] for k in ("step", "data_index", "skipped")})
    return h.hexdigest()


def losses(m: Member) -> dict[int, float]:
    """Each step's loss, from the member's Progress events."""
    return {x.step: x.loss for x in m.client.seen if isinstance(x, Progress) and x.step > 0}


def progress(m: Member) -> list[Progress]:
    return [x for x in m.client.seen if isinstance(x, Progress)]


def run_phase(
    members: list[Member], last: int, *, epoch: int, resume: int | None, **rv: Any
) -> list[Finished]:
    """Every member trains to step ``last`` and exits; their Finished events."""
    start(members, msgspec.structs.replace(SPEC, steps=last), epoch=epoch, resume_step=resume, **rv)
    done = [finished(m) for m in members]
    for m in members:
        rc, err = m.proc.finish(30)
        assert rc == exitcodes.OK, err
    return done


@dataclass(frozen=True)
class Reference:
    digest: str
    on_disk: str
    losses: dict[int, float]


# the module-wide reference is made once, on the one worker that runs the whole module
pytestmark = pytest.mark.xdist_group(__name__)


@pytest.fixture(scope="module")
def references(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[bool], Reference]]:
    """The uninterrupted 3-member run of SPEC with each reduce (made when first asked for)."""
    made: dict[bool, Reference] = {}
    started: list[Member] = []

    def reference(deterministic: bool) -> Reference:
        if deterministic not in made:
            root = tmp_path_factory.mktemp(f"ref-{deterministic}")
            members = serve([root / f"r{i}" for i in range(3)], [EVERY_STEP] * 3)
            started.extend(members)
            rv = {"logical_ranks": LOGICAL, "deterministic_reduce": deterministic}
            done = run_phase(members, SPEC.steps, epoch=1, resume=None, **rv)
            assert len({d.params_sha256 for d in done}) == 1
            on_disk = {state_digest(m.work, SPEC.steps) for m in members}
            assert len(on_disk) == 1, "the members' final checkpoints differ"
            made[deterministic] = Reference(
                done[0].params_sha256, on_disk.pop(), losses(members[0])
            )
        return made[deterministic]

    yield reference
    kill_all(started)


@dataclass
class Elastic:
    """What the 3 -> 2 -> 3 sequence left: the last epoch's members, every epoch's members."""

    final: list[Member]
    epochs: list[list[Member]]
    digests: list[str]


def shrink_and_grow(root: Path, cleanup: list[Member], deterministic: bool) -> Elastic:
    """3 members to step 8; members 0 and 2 alone (renumbered 0 and 1) to 16; those two and a
    new member holding a copy of a step-16 shard (renumbered again) to the end."""
    rv = {"logical_ranks": LOGICAL, "deterministic_reduce": deterministic}
    works = [root / f"w{i}" for i in range(3)]
    first = serve(works, [EVERY_STEP] * 3)
    cleanup += first
    run_phase(first, PHASES[0][1], epoch=1, resume=None, **rv)

    shrunk = serve([works[0], works[2]], [EVERY_STEP] * 2)
    cleanup += shrunk
    run_phase(shrunk, PHASES[1][1], epoch=2, resume=PHASES[0][1], **rv)

    new = root / "w3"
    step = checkpoint(works[2], PHASES[1][1])
    (new / "checkpoints").mkdir(parents=True)
    for f in (step, step.with_suffix(".json")):
        shutil.copy2(f, new / "checkpoints" / f.name)  # a promoted replica of old rank 2's
    grown = serve([works[2], new, works[0]], [EVERY_STEP] * 3)
    cleanup += grown
    done = run_phase(grown, PHASES[2][1], epoch=3, resume=PHASES[1][1], **rv)
    return Elastic(grown, [first, shrunk, grown], [d.params_sha256 for d in done])


@pytest.fixture
def cleanup() -> Iterator[list[Member]]:
    members: list[Member] = []
    yield members
    kill_all(members)


@pytest.mark.long  # the suite shrinks 3 -> 2 and grows back to 3 with deterministic_reduce,
# bit-exact with the uninterrupted run, over sshd (test_elastic_ssh), on the same executors' path
def test_deterministic_reduce_ends_bit_exact_after_a_shrink_and_a_grow(
    tmp_path: Path, references: Callable[[bool], Reference], cleanup: list[Member]
) -> None:
    ref = references(True)
    run = shrink_and_grow(tmp_path, cleanup, deterministic=True)
    assert run.digests == [ref.digest] * 3
    assert [state_digest(m.work, SPEC.steps) for m in run.final] == [ref.on_disk] * 3

    # The shrunk members loaded shards node ranks 0 and 2 of 3 wrote; then wrote as 0 and 1 of 2.
    w0, w2 = (m.work for m in run.epochs[1])
    shards = {(w, s.step): (s.node_rank, s.nnodes) for w in (w0, w2) for s in manifests(w)}
    assert (shards[w0, 8], shards[w2, 8]) == ((0, 3), (2, 3))
    assert (shards[w0, 16], shards[w2, 16]) == ((0, 2), (1, 2))
    for m in run.epochs[1]:
        resumed = next(x for x in m.client.seen if isinstance(x, Resumed))
        assert resumed.step == 8 and resumed.checkpoint == str(checkpoint(m.work, 8))
    # Uneven shares: 3 logical ranks on 2 ranks are [0] and [1, 2].
    said = [[x.text for x in m.client.seen if isinstance(x, Log)] for m in run.epochs[1]]
    assert any(t.startswith("logical ranks [0] of 3 on rank 0 of 2") for t in said[0]), said[0]
    assert any(t.startswith("logical ranks [1, 2] of 3 on rank 1 of 2") for t in said[1]), said[1]
    accumulation = [{p.accumulation for p in progress(m)} for m in run.epochs[1]]
    assert accumulation == [{2}, {4}], "4 rows in micro-batches of 2 per logical rank"
    # The grown group's new member (rank 1) started from the replica of old rank 2's shard.
    new = run.final[1]
    resumed = next(x for x in new.client.seen if isinstance(x, Resumed))
    assert resumed.step == 16 and resumed.checkpoint == str(checkpoint(new.work, 16))


@pytest.mark.long  # the suite proves the resize bit-exact with deterministic_reduce (test_elastic_ssh)
def test_plain_reduce_follows_the_reference_losses_and_keeps_the_global_batch(
    tmp_path: Path, references: Callable[[bool], Reference], cleanup: list[Member]
) -> None:
    ref = references(False)
    run = shrink_and_grow(tmp_path, cleanup, deterministic=False)
    got: dict[int, float] = {}
    for members in run.epochs:
        got.update(losses(members[0]))
    assert sorted(got) == sorted(ref.losses) == list(range(1, SPEC.steps + 1))
    worst = max(abs(got[s] - ref.losses[s]) / abs(ref.losses[s]) for s in got)
    assert worst <= LOSS_RTOL, f"worst relative loss difference {worst:.2e}"
    assert all(math.isfinite(v) for v in got.values())
    for (size, _), members in zip(PHASES, run.epochs, strict=True):
        for m in members:
            reports = progress(m)
            assert reports and {(p.global_batch, p.world_size) for p in reports} == {(12, size)}


def test_at_full_size_the_plain_reduce_equals_a_fixed_size_group_bit_for_bit(
    tmp_path: Path, cleanup: list[Member]
) -> None:
    """Logical ranks at W == L (one per rank) with the plain reduce is the fixed-size group's
    arithmetic exactly. Without dropout: an elastic job seeds each logical rank's dropout from
    the data position, a fixed-size group once per rank, so only their dropout masks differ."""
    spec = msgspec.structs.replace(
        SPEC, steps=10, config={**SPEC.config, "dropout": 0.0, "global_batch": 8}
    )
    digests: dict[str, list[str]] = {}
    for name, logical in (("fixed", None), ("logical", 2)):
        members = serve([tmp_path / name / f"r{i}" for i in range(2)])
        cleanup += members
        start(members, spec, logical_ranks=logical)
        digests[name] = [finished(m).params_sha256 for m in members]
        digests[name] += [state_digest(m.work, 10) for m in members]
        for m in members:
            rc, err = m.proc.finish(30)
            assert rc == exitcodes.OK, err
    assert digests["fixed"] == digests["logical"]
    assert len(set(digests["fixed"][:2])) == 1


def test_logical_ranks_spread_in_contiguous_blocks_with_fixed_rows() -> None:
    assert [list(block(p, 2, 3)) for p in range(2)] == [[0], [1, 2]]
    assert [list(block(p, 3, 3)) for p in range(3)] == [[0], [1], [2]]
    assert [list(block(p, 3, 8)) for p in range(3)] == [[0, 1], [2, 3, 4], [5, 6, 7]]
    assert [list(block(p, 1, 3)) for p in range(1)] == [[0, 1, 2]]
    layout = plan(12, 12, logical_ranks=3, world_size=2, rank=1)
    assert layout == Layout(3, 2, 1, 12, 4)
    assert [layout.rows(r) for r in layout.ranks] == [slice(4, 8), slice(8, 12)]
    assert (layout.local_rows, layout.widest_block) == (8, 2)
    assert plan(12, 2, logical_ranks=3, world_size=3, rank=0).rows(0) == slice(0, 4)
    assert [layout.fit(m) for m in (4, 3, 2, 1, 64)] == [4, 2, 2, 1, 4]


@pytest.mark.parametrize(
    ("kwargs", "text"),
    [
        (
            {"logical_ranks": 2, "world_size": 3, "rank": 0},
            "logical_ranks: 2 logical ranks cannot spread over 3 ranks",
        ),
        ({"logical_ranks": 0}, "logical_ranks: 0; at least 1"),
        (
            {"logical_ranks": 5, "world_size": 2},
            "config.global_batch: 12 rows do not split evenly over 5 logical ranks",
        ),
        (
            {"logical_ranks": 2, "world_size": 2, "micro": 4},
            "config.micro_batch: 4 does not divide each logical rank's share of 6 rows",
        ),
    ],
)
def test_a_layout_that_cannot_be_is_a_one_line_config_error(
    kwargs: dict[str, int], text: str
) -> None:
    micro = kwargs.pop("micro", 12)
    with pytest.raises(ConfigError) as e:
        plan(12, micro, **kwargs)
    assert str(e.value).startswith(text) and "\n" not in str(e.value), e.value


def test_a_group_larger_than_its_logical_ranks_is_refused_before_it_joins() -> None:
    rv = Rendezvous(node_rank=0, addresses=["127.0.0.1"] * 3, master_port=1, logical_ranks=2)
    with pytest.raises(ConfigError, match=r"^logical_ranks: 2 logical ranks cannot spread"):
        check(rv, torch.device("cpu"))
