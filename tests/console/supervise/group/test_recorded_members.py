"""Where a group supervisor finds its members at console start: the record's members; for a
job on one host, the record a single host's supervisor wrote (its host, no members) is a
group of one on that host (issue 30: a single-host job supervised as a group of one
reattached nothing: it retired the executor the last console left training, and started
another). No process is started."""

from __future__ import annotations

import asyncio
from pathlib import Path

from support.jobbed import Calls, services

from console.records.journal import Kind, read
from console.supervise.member import Member
from console.supervise.supervisor import Supervisor
from protocol.messages import CheckpointSaved
from protocol.spec import CheckpointManifest


def test_a_one_host_record_is_a_group_of_one_on_its_host(tmp_path: Path) -> None:
    svc = services(tmp_path, Calls())
    rec = svc.store.job("j")
    rec.host, rec.epoch = "b", 3  # it failed over from a to b under an earlier console
    g = Supervisor(svc, "j")
    assert g.members == ["b"]
    assert g.shards() == [None]  # replicated whole, as its single host's executor's were


def test_a_group_of_one_replicates_its_checkpoints_whole_where_one_host_did(
    tmp_path: Path,
) -> None:
    """A job on one host supervised as a group of one keeps one host's replica layout
    (``replicas/j`` on its spare, not ``replicas/j/node-0``) and journal line (no shard):
    the replicas its single host's executor left are the ones a failover finds."""
    svc = services(tmp_path, Calls())
    g = Supervisor(svc, "j")
    g._assign_members(["a"])
    g.commits.new_epoch(g.live.rec.epoch, 1)
    manifest = CheckpointManifest(
        job="j",
        step=10,
        file="step-0000000010.pt",
        size=1,
        sha256="ab" * 32,
        epoch=g.live.rec.epoch,
        spec_hash="s",
        code_version="c",
        created_at=1.0,
        node_rank=0,
    )
    saved = CheckpointSaved(
        manifest=manifest, path="/x", manifest_path="/x.json", write_s=0.1, stall_s=0.0
    )

    async def heard() -> None:
        g._messages.on_message(Member(0, "a"), saved)
        assert await svc.replicator.wait_idle("j", "c", 10)  # its copy tried (no such file)

    asyncio.run(heard())
    assert g.live.checkpoint == manifest  # committed: its one shard is the step
    assert ("j", "c") in svc.replicator.state and ("j/node-0", "c") not in svc.replicator.state
    svc.journal.flush()
    lines = list(read(svc.inv.state_dir / "journal.jsonl", kinds=[Kind.CHECKPOINT]))
    assert lines and all("shard" not in e.msg and "shard" not in e.data for e in lines)


def test_a_groups_record_names_its_members_and_never_its_host_alone(tmp_path: Path) -> None:
    svc = services(tmp_path, Calls())
    rec = svc.store.job("g")
    rec.host = "b"  # no members recorded: the inventory's, not a group of one on b
    assert Supervisor(svc, "g").members == ["a", "b"]
    rec.members = ["c", "b"]
    assert Supervisor(svc, "g").members == ["c", "b"]
