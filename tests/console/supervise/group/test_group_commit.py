"""Two-phase commit of a multi-host job's checkpoints: a step counts only once every member's
shard of it was reported under the current epoch."""

from __future__ import annotations

from console.records.state_store import JobRecord
from console.supervise.group.commit import KEPT, Commits


def commits(n: int = 3) -> tuple[Commits, JobRecord, list[int]]:
    rec = JobRecord()
    saves: list[int] = []
    c = Commits(rec, lambda: saves.append(1), n)
    c.new_epoch(1, n)
    return c, rec, saves


def test_a_step_is_committed_only_when_every_member_wrote_its_shard() -> None:
    c, rec, saves = commits()
    assert c.saved(0, 20, 1) is None
    assert c.saved(2, 20, 1) is None
    assert c.saved(2, 20, 1) is None, "a shard reported twice is one shard"
    assert c.committed is None and rec.committed == [] and not saves
    assert c.pending() == {20: [0, 2]}
    assert c.saved(1, 20, 1) == 20
    assert rec.committed == [20] and saves, "persisted when it commits"
    assert c.pending() == {}


def test_reports_of_an_earlier_epoch_never_count() -> None:
    c, _rec, _ = commits(2)
    c.saved(0, 40, 1)
    c.new_epoch(2, 2)
    assert c.saved(1, 40, 2) is None, "rank 0's shard of 40 was written under epoch 1"
    assert c.saved(0, 40, 1) is None, "a late report of epoch 1 under epoch 2"
    assert c.committed is None
    assert c.saved(0, 40, 2) == 40


def test_a_shard_from_outside_the_group_or_behind_the_commit_is_ignored() -> None:
    c, _, _ = commits(2)
    assert c.saved(5, 20, 1) is None
    assert c.saved(-1, 20, 1) is None
    c.saved(0, 20, 1)
    assert c.saved(1, 20, 1) == 20
    c.saved(0, 10, 1)
    assert c.saved(1, 10, 1) is None, "older than the newest committed step"
    assert c.steps() == [20]


def test_committing_a_step_drops_older_half_written_ones_and_the_list_is_bounded() -> None:
    c, rec, _ = commits(2)
    c.saved(0, 20, 1)  # rank 1 never wrote 20
    c.saved(0, 40, 1)
    assert c.saved(1, 40, 1) == 40
    assert c.pending() == {}
    for step in range(60, 60 + 20 * (KEPT + 5), 20):
        c.saved(0, step, 1)
        c.saved(1, step, 1)
    assert len(rec.committed) == KEPT
    assert c.steps()[0] == rec.committed[-1] == c.committed


def test_an_epoch_of_another_size_commits_with_its_own_members() -> None:
    """An elastic group shrunk from 3 to 2: a step is whole once the 2 wrote it, and a report
    from a rank the shrunk group no longer has counts for nothing."""
    c, rec, _ = commits(3)
    c.saved(0, 20, 1)
    c.new_epoch(2, 2)
    assert c.saved(2, 40, 2) is None, "no node rank 2 in a group of 2"
    assert c.saved(0, 40, 2) is None
    assert c.saved(1, 40, 2) == 40
    c.new_epoch(3, 3)
    c.saved(0, 60, 3)
    assert c.saved(1, 60, 3) is None, "grown back to 3: the third shard is awaited"
    assert c.saved(2, 60, 3) == 60 and rec.committed == [40, 60]
