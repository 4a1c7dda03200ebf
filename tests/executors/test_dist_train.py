"""The torch kind trains one job across hosts: real ``serve`` executors, real gloo on loopback.

Each member is its own executor process in its own workdir, told its node rank and the
rendezvous in Start, as the console would. The checks read the events, the manifests on disk
and ``/proc``, not the executors' own account of themselves.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import torch
import torch.distributed
from support.distbed import (
    TIMEOUT_S,
    Member,
    Reference,
    finished,
    free_port,
    kill_all,
    manifests,
    serve,
    start,
    uninterrupted,
)
from support.helpers import TINY_CONFIG, env_with

from executors import exitcodes
from executors.kinds.torch.dist import CONNECT_TRY_S, GLOO_IFNAME, interface_of, joined
from executors.kinds.torch.logical import plan
from protocol.errors import ConfigError
from protocol.faults import StopReason
from protocol.messages import (
    Abandon,
    CheckpointSaved,
    Fault,
    Finished,
    Heartbeat,
    Log,
    Progress,
    Rendezvous,
    Resumed,
    RunEnded,
    Start,
    Stop,
    Stopped,
)
from protocol.spec import JobSpec

SPEC = JobSpec(
    name="dp", steps=40, seed=5, checkpoint_every_steps=10, keep_checkpoints=5, config=TINY_CONFIG
)
LONG = JobSpec(
    name="dp", steps=1_000_000, seed=5, checkpoint_every_steps=100_000, config=TINY_CONFIG
)


def own_address() -> str | None:
    """A non-loopback IPv4 address of this machine, if it has one."""
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family == socket.AF_INET and not a.address.startswith("127."):
                return str(a.address)
    return None


def listening(port: int) -> bool:
    """The kernel's word: something listens on ``port`` (a store's server)."""
    return any(
        c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port
        for c in psutil.net_connections("tcp")
    )


@pytest.fixture
def cleanup() -> Iterator[list[Member]]:
    members: list[Member] = []
    yield members
    kill_all(members)


# the module-wide reference is made once, on the one worker that runs the whole module
pytestmark = pytest.mark.xdist_group(__name__)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Reference:
    return uninterrupted(tmp_path_factory.mktemp("ref"), SPEC)


def test_two_ranks_finish_equal_and_each_writes_its_own_shards(reference: Reference) -> None:
    for rank, work in enumerate(reference.works):
        shards = manifests(work)
        assert [s.step for s in shards] == [10, 20, 30, 40]
        assert {(s.node_rank, s.nnodes) for s in shards} == {(rank, 2)}


def test_a_killed_rank_faults_the_survivor_which_restarts_in_place_bit_exact(
    tmp_path: Path, reference: Reference, cleanup: list[Member]
) -> None:
    # The victim's checkpoint writes are slow, so after its step 10 is saved it waits seconds
    # on that write at its next checkpoint: it is killed mid-run, never after its last step.
    slow = env_with(HOTSPARE_INJECT="slow_write@0.01")
    victim, survivor = members = serve([tmp_path / "r0", tmp_path / "r1"], [slow, None])
    cleanup += members
    start(members, SPEC)
    for m in members:
        m.client.until(lambda x: isinstance(x, CheckpointSaved) and x.manifest.step == 10, 60)
    victim.proc.proc.send_signal(signal.SIGKILL)
    killed_at = time.monotonic()
    ended = survivor.client.until(lambda x: isinstance(x, RunEnded), TIMEOUT_S + 5)
    assert time.monotonic() - killed_at < TIMEOUT_S
    assert isinstance(ended, RunEnded) and ended.fault == "crash"
    assert not any(isinstance(x, Finished) for x in survivor.client.seen)
    beat = survivor.client.until(lambda x: isinstance(x, Heartbeat) and x.state == "faulted", 5)
    assert isinstance(beat, Heartbeat)
    pid = survivor.proc.proc.pid
    assert survivor.proc.proc.poll() is None and Path(f"/proc/{pid}").exists()
    victim.proc.finish(30)

    (again,) = serve([victim.work])
    cleanup.append(again)
    members = [again, survivor]
    start(members, SPEC, epoch=2, resume_step=10)
    for m in members:
        resumed = m.client.until(lambda x: isinstance(x, Resumed) and x.epoch == 2, 60)
        assert isinstance(resumed, Resumed) and resumed.step == 10
    assert [finished(m).params_sha256 for m in members] == [reference.digest] * 2
    assert survivor.proc.proc.pid == pid, "the survivor restarted in its own process"
    assert [s.step for s in manifests(survivor.work)] == [10, 20, 30, 40]


def test_a_member_whose_join_failed_joins_the_next_epoch_with_a_fresh_process(
    tmp_path: Path, reference: Reference, cleanup: list[Member]
) -> None:
    """A join that fails (its peer never came) leaves nothing behind in the process: the next
    epoch, restarted in place beside a fresh executor, trains to the end. A bug: torch names the
    default group from a process-wide count that a failed join had already raised, so the
    restarted member waited on keys of group "1" and the fresh one on group "0"; both timed
    out, and under load every epoch after failed the same way (a group restarted 14 times)."""
    (first,) = serve([tmp_path / "r0"])
    cleanup.append(first)
    alone = Rendezvous(
        node_rank=0, addresses=["127.0.0.1"] * 2, master_port=free_port(), join_timeout_s=2.0
    )
    first.client.send(Start(spec=SPEC, epoch=1, rendezvous=alone))
    ended = first.client.until(lambda x: isinstance(x, RunEnded), 30)
    assert isinstance(ended, RunEnded) and ended.fault == "crash", ended
    pid = first.proc.proc.pid

    (fresh,) = serve([tmp_path / "r1"])
    cleanup.append(fresh)
    start([first, fresh], SPEC, epoch=2)
    assert [finished(m).params_sha256 for m in (first, fresh)] == [reference.digest] * 2
    assert first.proc.proc.pid == pid, "the first member restarted in its own process"


def test_a_member_started_past_the_collective_timeout_still_joins_and_trains_bit_exact(
    tmp_path: Path, reference: Reference, cleanup: list[Member]
) -> None:
    """The join waits for the slowest rank's start (``join_timeout_s``), not for a collective's
    timeout. Run A (a fresh-clone suite on a loaded machine): a follower still importing torch
    16 s after its epoch began failed the whole epoch ("Timed out after 16 seconds waiting for
    clients. 3/4 clients joined."), since the store torch made from a ``tcp://`` address
    waited the collective timeout. Here rank 0 (which serves the store) waits past it."""
    collective_s = 5.0
    members = serve([tmp_path / "r0", tmp_path / "r1"])
    cleanup += members
    port = free_port()

    def rendezvous(rank: int) -> Rendezvous:
        return Rendezvous(
            node_rank=rank,
            addresses=["127.0.0.1"] * 2,
            master_port=port,
            timeout_s=collective_s,
            join_timeout_s=60,
        )

    first, late = members
    first.client.send(Start(spec=SPEC, epoch=1, rendezvous=rendezvous(0)))
    first.client.until(lambda x: listening(port), 60)  # rank 0 waits in its join from here
    first.client.send(Abandon(epoch=0))  # another epoch's (a late word): this join goes on
    joining = time.monotonic()
    # the fault's length: the other member comes a second after a collective would have failed
    first.client.until(lambda x: time.monotonic() - joining > collective_s + 1, 30)
    assert not any(isinstance(x, RunEnded) for x in first.client.seen)
    late.client.send(Start(spec=SPEC, epoch=1, rendezvous=rendezvous(1)))
    assert [finished(m).params_sha256 for m in members] == [reference.digest] * 2


def test_a_rank_that_joins_before_rank_0_serves_waits_quietly_and_trains_bit_exact(
    tmp_path: Path, reference: Reference, cleanup: list[Member]
) -> None:
    """Rank 1 started two store tries before rank 0: it waits for rank 0's store without a word
    (a store client dialling a port nothing served yet wrote torch's C++ error and stack trace
    into executor.log at every try), then both train to the reference's parameters."""
    members = serve([tmp_path / "r0", tmp_path / "r1"])
    cleanup += members
    port = free_port()

    def rendezvous(rank: int) -> Rendezvous:
        return Rendezvous(node_rank=rank, addresses=["127.0.0.1"] * 2, master_port=port)

    zero, early = members
    early.client.send(Start(spec=SPEC, epoch=1, rendezvous=rendezvous(1)))
    began = time.monotonic()
    # the fault's length: two of the joining rank's tries pass with nothing served
    early.client.until(lambda x: time.monotonic() - began > 2 * CONNECT_TRY_S + 0.5, 30)
    assert not listening(port) and not any(isinstance(x, RunEnded) for x in early.client.seen)
    zero.client.send(Start(spec=SPEC, epoch=1, rendezvous=rendezvous(0)))
    assert [finished(m).params_sha256 for m in members] == [reference.digest] * 2
    for m in members:
        rc, err = m.proc.finish(30)
        assert rc == exitcodes.OK, err
        assert "c10d" not in err and "TCPStore" not in err, err[-2000:]


def test_an_abandoned_epoch_ends_its_joins_at_once_and_each_member_stays_warm_for_the_next(
    tmp_path: Path, reference: Reference, cleanup: list[Member]
) -> None:
    """A member lost before it joined: the console abandons the epoch (``Abandon``), and each
    member still waiting in the join ends now, as a failed join does (``RunEnded``: the same
    process waits, warm), not after the join's timeout (300 s), past its lease, to be started
    afresh. The next epoch, without the lost member, trains to the reference's parameters."""
    members = serve([tmp_path / "r0", tmp_path / "r1"])
    cleanup += members
    port = free_port()
    for rank, m in enumerate(members):  # a group of three whose third never comes
        rv = Rendezvous(node_rank=rank, addresses=["127.0.0.1"] * 3, master_port=port)
        m.client.send(Start(spec=SPEC, epoch=1, rendezvous=rv))
    members[0].client.until(lambda x: listening(port), 60)
    told = time.monotonic()
    for m in members:
        m.client.send(Abandon(epoch=1))
    for m in members:
        ended = m.client.until(lambda x: isinstance(x, RunEnded), 60)
        assert isinstance(ended, RunEnded) and ended.fault == "crash", ended
        assert "abandoned by the console" in ended.message, ended.message
    assert time.monotonic() - told < 30, "ended when told, not at the join's timeout"
    pids = [m.proc.proc.pid for m in members]
    start(members, SPEC, epoch=2)
    assert [finished(m).params_sha256 for m in members] == [reference.digest] * 2
    assert [m.proc.proc.pid for m in members] == pids, "each restarted in its own process"


def test_resuming_a_step_a_member_lacks_or_another_member_wrote_is_a_clear_fault(
    tmp_path: Path, reference: Reference, cleanup: list[Member]
) -> None:
    works = [tmp_path / "r0", tmp_path / "r1"]
    shutil.copytree(reference.works[1] / "checkpoints", works[0] / "checkpoints")  # rank 1's
    members = serve(works)
    cleanup += members
    start(members, SPEC, resume_step=20)
    why = ["the shard of node rank 1 of 2; this member is node rank 0 of 2", "no checkpoint"]
    for m, text in zip(members, why, strict=True):
        ended = m.client.until(lambda x: isinstance(x, RunEnded), 60)
        assert isinstance(ended, RunEnded) and ended.fault == "resume_failed", ended
        assert "committed step 20" in ended.message and text in ended.message, ended.message
        assert not any(isinstance(x, Resumed) for x in m.client.seen)
    assert (works[0] / "checkpoints" / "step-0000000020.json").exists(), "nothing loaded or lost"
    assert not (works[0] / "checkpoints" / "step-0000000030.json").exists(), "uncommitted"

    members[0].client.send(Stop(reason=StopReason.OPERATOR))
    rv = Rendezvous(node_rank=2, addresses=["127.0.0.1"] * 2, master_port=1)
    members[1].client.send(Start(spec=SPEC, epoch=2, rendezvous=rv))
    refused = members[1].client.until(lambda x: isinstance(x, Fault) and x.fault == "config", 10)
    assert isinstance(refused, Fault) and "node rank 2 outside 0..1" in refused.message
    assert "\n" not in refused.message
    codes = [m.proc.finish(30) for m in members]
    assert [rc for rc, _ in codes] == [exitcodes.STOPPED, exitcodes.CONFIG]
    for _, err in codes:
        assert "Traceback" not in err, err


def local_ips(pid: int) -> set[str]:
    """The local addresses of a process's established TCP connections (the store's, gloo's)."""
    conns = psutil.Process(pid).net_connections(kind="tcp")
    ips = {c.laddr.ip for c in conns if c.status == psutil.CONN_ESTABLISHED}
    return {ip.removeprefix("::ffff:") for ip in ips}  # the store listens dual-stack


def test_a_stop_sent_to_one_rank_stops_both_at_the_same_step(
    tmp_path: Path, cleanup: list[Member]
) -> None:
    """On this machine's own (not loopback) address when it has one: gloo binds to it, not to
    where the hostname resolves (loopback here), so the ranks' links use that address."""
    members = serve([tmp_path / "r0", tmp_path / "r1"])
    cleanup += members
    address = own_address()
    start(members, LONG, address=address or "127.0.0.1")
    for m in members:  # trained a step: a stop at once after Resumed may come at step 0
        m.client.until(lambda x: isinstance(x, Progress) and x.step > 0, 60)
    if address is not None:
        for m in members:
            assert local_ips(m.proc.proc.pid) == {address}
    members[1].client.send(Stop(reason=StopReason.OPERATOR))
    stops = [m.client.until(lambda x: isinstance(x, (Stopped, RunEnded)), 30) for m in members]
    assert all(isinstance(s, Stopped) for s in stops), stops
    first, second = (s for s in stops if isinstance(s, Stopped))
    assert (first.reason, second.reason) == ("peer_stopped", "operator")
    assert first.step == second.step > 0
    assert first.checkpoint_step == second.checkpoint_step == first.step
    for m in members:
        (shard,) = manifests(m.work)
        assert shard.step == first.step
        rc, err = m.proc.finish(30)
        assert rc == exitcodes.STOPPED, err
    assert os.path.exists(members[0].work / "events.jsonl")


def test_a_group_of_one_trains_what_one_host_alone_trains(
    tmp_path: Path, cleanup: list[Member]
) -> None:
    """A single-host job is a group of one (issue 30): the same spec started with a
    rendezvous of one member ends with the parameters of a Start without one, so a job
    supervised either way trains one trajectory. Rank 0 reseeded its random streams after
    building the model, and a group of one ended elsewhere."""
    spec = SPEC  # dropout 0.1 and random batches: both draw on the seeded streams
    alone, grouped = serve([tmp_path / "alone", tmp_path / "grouped"])
    cleanup += [alone, grouped]
    alone.client.send(Start(spec=spec, epoch=1))
    start([grouped], spec)
    digests = [finished(m).params_sha256 for m in (alone, grouped)]
    assert digests[0] == digests[1]
    assert [s.step for s in manifests(grouped.work)] == [10, 20, 30, 40]
    assert {(s.node_rank, s.nnodes) for s in manifests(grouped.work)} == {(0, 1)}


def test_a_group_of_one_whose_committed_step_is_damaged_resumes_from_the_one_before(
    tmp_path: Path, cleanup: list[Member]
) -> None:
    """A job on one host (a group of one, issue 30) told to resume from step 30, whose file is
    damaged: nothing else must load the same step, so it skips it, saying so (a fault naming
    the file), and resumes from step 20, as one host alone does; a member of a larger group
    ends its run instead (``resume_failed``: the console chooses another step for all). It
    ended its run here too, spending a restart (chaos seed "five")."""
    (first,) = serve([tmp_path / "w"])
    cleanup.append(first)
    start([first], SPEC)
    finished(first)
    first.proc.finish(30)
    damaged = tmp_path / "w" / "checkpoints" / "step-0000000030.pt"
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0xFF
    damaged.write_bytes(bytes(data))
    (again,) = serve([tmp_path / "w"])
    cleanup.append(again)
    start([again], SPEC, epoch=2, resume_step=30)
    resumed = again.client.until(lambda x: isinstance(x, Resumed), 60)
    assert isinstance(resumed, Resumed) and resumed.step == 20, resumed
    faults = [x for x in again.client.seen if isinstance(x, Fault)]
    assert [f.fault for f in faults] == ["checkpoint_corrupt"], faults
    assert damaged.name in faults[0].message
    said = [x.text for x in again.client.seen if isinstance(x, Log) and x.level == "warning"]
    assert any(
        "cannot resume from the committed step 30" in t and "resuming from step 20" in t
        for t in said
    ), said  # the console said "resuming from committed step 30": the run says otherwise
    finished(again)


def test_a_group_is_left_at_the_end_so_the_next_epoch_can_join_in_the_same_process() -> None:
    """In this process: one member groups, one after another, on IPv4, IPv6 and a non-loopback
    address (each as the machine has it); nothing of a group (or gloo's binding) outlasts it."""
    candidates = ["127.0.0.1", "::1" if interface_of("::1") else None, own_address()]
    for address in filter(None, candidates):
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        with socket.socket(family) as s:
            s.bind((address, 0))
            port = int(s.getsockname()[1])
        rv = Rendezvous(node_rank=0, addresses=[address], master_port=port, timeout_s=5)
        warnings: list[str] = []
        with joined(rv, torch.device("cpu"), warnings.append) as group:
            assert torch.distributed.is_initialized() and group.world_size == 1
            agreed = group.agree(save=True, stop=False, checkpoint=True)
            assert (agreed.save, agreed.stop, agreed.checkpoint) == (True, False, True)
        assert not torch.distributed.is_initialized(), address
        assert GLOO_IFNAME not in os.environ and warnings == []
    assert interface_of("127.0.0.1") == "lo" and interface_of("198.51.100.7") is None


def test_each_rank_takes_its_contiguous_share_of_the_global_batch() -> None:
    """A fixed-size group: each rank is one logical rank (``executors.kinds.torch.logical``)."""

    def share(rank: int, n: int, batch: int, micro: int) -> tuple[slice, int]:
        layout = plan(batch, micro, logical_ranks=n, world_size=n, rank=rank, elastic=False)
        (only,) = layout.ranks
        return layout.rows(only), layout.micro_batch

    assert [share(r, 2, 8, 8) for r in (0, 1)] == [(slice(0, 4), 4), (slice(4, 8), 4)]
    assert share(2, 3, 12, 2) == (slice(8, 12), 2)
    with pytest.raises(
        ConfigError, match=r"^config.global_batch: 8 rows do not split evenly over 3 ranks$"
    ):
        share(0, 3, 8, 8)
    with pytest.raises(ConfigError, match=r"^config.micro_batch: 4 does not divide .* 6 rows"):
        share(0, 2, 12, 4)
