"""More than one rank per host in the torch kind (``procs_per_host``, issue 31): local rank 0 in
the executor, the others in follower processes it starts for the run
(``executors.kinds.torch.local_ranks``). Real ``serve`` executors and gloo on loopback, as in
``test_dist_train``; the checks read /proc, the files on disk and the parameters' digest."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from support.distbed import Member, Reference, finished, kill_all, serve, start, uninterrupted
from support.helpers import TINY_CONFIG

from protocol.spec import JobSpec

SPEC = JobSpec(
    name="lr", steps=30, seed=5, checkpoint_every_steps=10, keep_checkpoints=5, config=TINY_CONFIG
)


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
