"""What the job detail says of a multi-host job: every member with its rank and host state, the
committed step, and each spare's replica of each member's shard."""

from __future__ import annotations

from pathlib import Path

import msgspec
from support.groupbed import controller, local_group
from support.manifests import manifest as stub_manifest

from console.replication.replicator import ReplicaState
from console.states import HostState
from console.ui.view_detail import checkpoint_rows, job_summary, replica_lines
from protocol.spec import CheckpointManifest


def manifest(step: int, shard: int) -> CheckpointManifest:
    return stub_manifest(step, node_rank=shard, nnodes=3)


def test_the_job_detail_names_each_member_and_each_shards_replica(tmp_path: Path) -> None:
    ctl = controller(local_group(tmp_path))
    try:
        sup = ctl.jobs["j"]
        sup.spares = ["d"]
        ctl.store.job("j").committed = [20, 40]
        ctl.fleet.set_state("b", HostState.SUSPECT, "test")
        ctl.replicator.state[("j/node-1", "d")] = ReplicaState(manifest(40, 1), at=100.0)
        summary = job_summary(ctl, "j")
        assert "on a, b, c -> d" in summary
        assert "committed step 40" in summary
        assert "b (rank 1, suspect)" in summary
        assert "ddp: a whole copy on each member" in summary
        lines = replica_lines(ctl, "j", now=103.0)
        assert lines == "d: shard 0 none yet; shard 1 step 40 1 B (3.0s ago); shard 2 none yet"
    finally:
        ctl.lock.release()


def test_the_jobs_row_shows_every_member_and_the_spares_oldest_shard(tmp_path: Path) -> None:
    from console.ui.view import job_rows

    ctl = controller(local_group(tmp_path))
    try:
        sup = ctl.jobs["j"]
        sup.live.host, sup.spares, sup.live.step = "a", ["d"], 45
        sup.checkpoint = manifest(40, 0)  # the newest committed step: the lag counts from it
        for shard, step in ((0, 40), (1, 20), (2, 40)):
            ctl.replicator.state[(f"j/node-{shard}", "d")] = ReplicaState(manifest(step, shard))
        row = job_rows(ctl)["j"]
        assert row[1] == "a+b+c -> d"
        assert row[-1] == "d @20 (lag 20)", "as current as its oldest shard"
        ctl.replicator.state[("j/node-2", "d")].full = True
        assert job_rows(ctl)["j"][-1] == "d @20 (lag 20) DISK FULL"
    finally:
        ctl.lock.release()


def test_a_shrunk_elastic_job_shows_its_size_and_its_throughput_at_each_size(
    tmp_path: Path,
) -> None:
    import time

    from console.ui.view import job_rows

    ctl = controller(local_group(tmp_path, min_hosts=2))
    try:
        sup = ctl.jobs["j"]
        sup.live.rec.members, sup.spares = ["a", "c"], []
        now = time.time()
        sup.live.rates = {3: (4.0, now - 30), 2: (2.5, now - 2)}
        assert job_rows(ctl)["j"][1] == "a+c (2/3) -> -", "trained on 2 of the 3 planned"
        summary = job_summary(ctl, "j")
        assert "size 2 of 3 planned (min 2)" in summary
        assert "3 ranks 4.00 steps/s (30s ago); 2 ranks 2.50 steps/s (2.0s ago)" in summary
        sup.live.rec.members = ["a", "c", "d"]
        assert job_rows(ctl)["j"][1] == "a+c+d -> -", "back to its planned size: no mark"
    finally:
        ctl.lock.release()


def test_a_fixed_size_job_s_detail_says_nothing_of_sizes(tmp_path: Path) -> None:
    ctl = controller(local_group(tmp_path))
    try:
        assert "planned" not in job_summary(ctl, "j")
    finally:
        ctl.lock.release()


def test_a_sharded_jobs_detail_says_so_with_each_members_part(tmp_path: Path) -> None:
    ctl = controller(local_group(tmp_path, parallel="fsdp"))
    try:
        sup = ctl.jobs["j"]
        for shard, host in enumerate("abc"):
            m = msgspec.structs.replace(manifest(40, shard), size=13_300_000 + shard)
            sup.checkpoints.append((host, m))
        summary = job_summary(ctl, "j")
        assert "fsdp: model and optimizer sharded, each member holds its part" in summary
        assert "a (rank 0, up, part 13 MiB @40)" in summary, summary
        assert "c (rank 2, up, part 13 MiB @40)" in summary, summary
    finally:
        ctl.lock.release()


def test_a_job_of_two_ranks_per_host_names_each_members_ranks(tmp_path: Path) -> None:
    ctl = controller(local_group(tmp_path, parallel="fsdp", procs_per_host=2))
    try:
        summary = job_summary(ctl, "j")
        assert "each member holds its part, 2 ranks per host" in summary, summary
        assert "a (node 0: ranks 0-1, up)" in summary, summary
        assert "c (node 2: ranks 4-5, up)" in summary, summary
    finally:
        ctl.lock.release()


def test_a_step_is_on_a_spare_once_every_shard_of_it_is(tmp_path: Path) -> None:
    """The checkpoint rows name a spare beside a committed step when each member's shard of
    it is there (a group's replicas were never matched: no spare was ever listed)."""
    ctl = controller(local_group(tmp_path))
    try:
        sup = ctl.jobs["j"]
        sup.spares = ["d", "e"]
        sup.checkpoints.extend([("a", manifest(20, 2)), ("a", manifest(40, 0))])
        for shard in range(3):  # d: every shard of 40, and of 20 kept beside it
            ctl.replicator.state[(f"j/node-{shard}", "d")] = ReplicaState(
                manifest(40, shard), kept=[20, 40]
            )
        for shard in range(2):  # e: two of the three shards of 40 only
            ctl.replicator.state[(f"j/node-{shard}", "e")] = ReplicaState(manifest(40, shard))
        rows = checkpoint_rows(ctl, "j", now=100.0)
        holders = {row[0]: row[-1] for row in rows.values()}
        assert holders == {"40": "a, d (replica)", "20": "a, d (replica)"}
    finally:
        ctl.lock.release()


def test_an_elastic_group_shrunk_to_one_member_still_shows_its_shards_replica(
    tmp_path: Path,
) -> None:
    from console.ui.view import job_rows

    ctl = controller(local_group(tmp_path, min_hosts=1))
    try:
        sup = ctl.jobs["j"]
        sup.live.rec.members, sup.spares, sup.live.host = ["a"], ["d"], "a"
        sup.checkpoint = manifest(40, 0)
        ctl.replicator.state[("j/node-0", "d")] = ReplicaState(manifest(40, 0))
        assert job_rows(ctl)["j"][-1] == "d @40 (lag 0)", "shard 0's replica, not a whole one"
        assert replica_lines(ctl, "j").startswith("d: shard 0 step 40 1 B")
    finally:
        ctl.lock.release()
