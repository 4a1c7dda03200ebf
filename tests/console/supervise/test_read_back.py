"""When an ended run's events are read for a checkpoint its link never delivered (``ReadBack``),
decided without processes: the dispatcher and the events are stand-ins, the rule is the
console's. The real-process proofs: test_group_local's uninterrupted group (a finish whose
last shard was lost on its link), test_group_unwatched and test_controller_local (a stop)."""

from __future__ import annotations

import asyncio
import types
from pathlib import Path

import pytest
from support.manifests import manifest
from support.manifests import saved as saved_message

from console.records.journal import Journal, Kind, read
from console.supervise.member import Member
from console.supervise.outcome import Exit, Outcome, from_finished, from_stopped
from console.supervise.read_back import ReadBack
from protocol.faults import StopReason
from protocol.messages import CheckpointSaved


def saved(step: int, epoch: int = 1) -> CheckpointSaved:
    return saved_message(manifest(step, epoch=epoch))


class Dispatcher:
    """The part of ``JobMessages`` a read-back uses: what was heard, and the dispatch."""

    def __init__(self, newest: int) -> None:
        self.newest = newest
        self.dispatched: list[int] = []

    def newest_step(self, m: Member) -> int:
        return self.newest

    def on_message(self, m: Member, msg: CheckpointSaved) -> None:
        self.dispatched.append(msg.manifest.step)


def read_back(
    tmp_path: Path, outcome: Outcome, *, heard: int, on_disk: CheckpointSaved | None
) -> tuple[list[int], int, list[str]]:
    """What a read-back of ``outcome`` dispatched, how often the events were read, and what
    it journalled, with ``heard`` the newest step heard and ``on_disk`` the events' last one."""
    dispatcher, reads = Dispatcher(heard), []

    async def ended(host: str) -> Outcome:
        reads.append(host)
        return Outcome(Exit.FINISHED, "finished", saved=on_disk)

    journal = Journal(tmp_path / "journal.jsonl")
    rb = ReadBack(
        types.SimpleNamespace(name="j", epoch=1),  # type: ignore[arg-type]
        messages=dispatcher,  # type: ignore[arg-type]
        ended=ended,
        journal=journal,
    )
    asyncio.run(rb.read_back(Member(2, "c"), outcome))
    lines = [e.msg for e in read(tmp_path / "journal.jsonl") if e.kind is Kind.EXECUTOR]
    return dispatcher.dispatched, len(reads), lines


def test_a_finish_whose_last_checkpoint_was_never_heard_has_it_read_back(tmp_path: Path) -> None:
    finish = from_finished(240, "sha", [])
    got, reads, lines = read_back(tmp_path, finish, heard=220, on_disk=saved(240))
    assert (got, reads) == ([240], 1)
    assert lines == [
        "j: checkpoint step 240 read back from the events of the executor on c "
        "(its link closed before it said so)"
    ]


@pytest.mark.parametrize(
    ("heard", "on_disk"),
    [
        (240, saved(240)),  # its checkpoint at the finish was heard: nothing is read
        (220, saved(220)),  # it finished past its last checkpoint, which was heard
        (220, saved(240, epoch=0)),  # another epoch's: never this one's
    ],
)
def test_a_finish_whose_checkpoints_were_all_heard_dispatches_nothing(
    tmp_path: Path, heard: int, on_disk: CheckpointSaved
) -> None:
    got, reads, lines = read_back(
        tmp_path, from_finished(240, "sha", []), heard=heard, on_disk=on_disk
    )
    assert got == [] and lines == []
    assert reads == (0 if heard == 240 else 1)


def test_an_operators_stop_and_a_config_fault_are_never_read_back(tmp_path: Path) -> None:
    stop = from_stopped(StopReason.OPERATOR, 230, 240)
    config = Outcome(Exit.CONFIG, "bad key")
    for outcome in (stop, config):
        assert read_back(tmp_path, outcome, heard=220, on_disk=saved(240)) == ([], 0, [])


def test_a_member_stopped_with_its_peers_is_read_back(tmp_path: Path) -> None:
    peer = from_stopped(StopReason.PEER_STOPPED, 240, 240)
    got, reads, _ = read_back(tmp_path, peer, heard=220, on_disk=saved(240))
    assert (got, reads) == ([240], 1)
