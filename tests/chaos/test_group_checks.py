"""The multi-host checks themselves can fail: each is shown the violation it must report and
the same scene without it (a sampler's record, executors' events.jsonl, the journal)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from chaos import group_checks as gc
from chaos import invariants as inv
from chaos.disk import DiskWatch, Manifest
from chaos.faults import Injected
from chaos.procs import Sampler, Trainer, Window
from console.records.incidents import incidents
from console.records.journal import Event, Kind

EPOCHS = [gc.Epoch(1, 10.0, ("a", "b", "c")), gc.Epoch(2, 20.0, ("a", "b", "d"))]
"""c lost at epoch 1, d its spare at node rank 2 from epoch 2."""


def _sampler(tmp_path: Path, trainers: dict[str, list[tuple[int, float]]]) -> Sampler:
    """pid and window start (one second each) per host."""
    sampler = Sampler({"j": [tmp_path / h for h in "abcde"]})
    for host, seen in trainers.items():
        for pid, t0 in seen:
            t = sampler.trainers.setdefault(pid, Trainer(pid, "j", str(tmp_path / host)))
            t.windows.append(Window(t0, t0 + 1.0))
    return sampler


def test_a_stale_member_training_beside_its_replacement_is_two_trainers_of_one_rank(
    tmp_path: Path,
) -> None:
    hosts = {str(tmp_path / h): h for h in "abcde"}
    fine = {"a": [(1, 11.0), (1, 21.0)], "c": [(3, 11.0)], "d": [(4, 21.0), (4, 22.0)]}
    assert gc.two_trainers_per_rank(_sampler(tmp_path, fine), EPOCHS, hosts, "j") == ([], 0)
    stale = {**fine, "c": [(3, 11.0), (3, 21.0), (3, 22.0)]}
    lines, n = gc.two_trainers_per_rank(_sampler(tmp_path, stale), EPOCHS, hosts, "j")
    assert n == 1, lines
    assert "node rank 2 from 21.000 to 23.000" in lines[0] and "(3, 'c'), (4, 'd')" in lines[0]
    stranger = {**fine, "e": [(5, 12.0)]}
    lines, n = gc.two_trainers_per_rank(_sampler(tmp_path, stranger), EPOCHS, hosts, "j")
    assert n == 0 and "pid 5 on e" in lines[0]


def _events(workdir: Path, *events: dict[str, Any]) -> None:
    workdir.mkdir(parents=True, exist_ok=True)
    with open(workdir / "events.jsonl", "a") as f:
        f.writelines(json.dumps(e) + "\n" for e in events)


def _shard(step: int, rank: int, epoch: int) -> dict[str, Any]:
    manifest = {"step": step, "node_rank": rank, "nnodes": 3, "epoch": epoch}
    return {"kind": "checkpoint", "manifest": manifest}


def _resumed(workdir: Path, step: int, epoch: int) -> dict[str, Any]:
    path = str(workdir / "checkpoints" / f"step-{step:010d}.pt") if step else None
    return {"kind": "resumed", "step": step, "epoch": epoch, "checkpoint": path}


def test_a_resume_of_a_step_not_every_rank_wrote_under_one_epoch_is_reported(
    tmp_path: Path,
) -> None:
    w = {h: tmp_path / h for h in "abcd"}
    _events(w["a"], _shard(20, 0, 1), _shard(40, 0, 1), _resumed(w["a"], 0, 1))
    _events(w["b"], _shard(20, 1, 1), _shard(40, 1, 1), _resumed(w["b"], 0, 1))
    _events(w["c"], _shard(20, 2, 1), _resumed(w["c"], 0, 1))  # lost before its shard of 40
    disk = DiskWatch({}, ["j"])
    for h in "ab":
        _events(w[h], _resumed(w[h], 20, 2))
    _events(w["d"], _resumed(w["d"], 20, 2))
    assert gc.committed_loads(w, EPOCHS, disk, "j", 3) == ([], 3)

    for h in "ab":
        _events(w[h], _resumed(w[h], 40, 3))
    _events(w["d"], _resumed(w["d"], 20, 3))
    eps = [*EPOCHS, gc.Epoch(3, 30.0, ("a", "b", "d"))]
    lines, loads = gc.committed_loads(w, eps, disk, "j", 3)
    assert loads == 6
    assert len([ln for ln in lines if "which no earlier epoch committed" in ln]) == 2, lines
    assert "the members of epoch 3 resumed at different steps: [20, 40]" in lines[-1]


def test_a_member_loading_another_ranks_shard_is_reported(tmp_path: Path) -> None:
    w = {h: tmp_path / h for h in "abcd"}
    for h, rank in (("a", 0), ("b", 1), ("c", 2)):
        _events(w[h], _shard(20, rank, 1))
    for h in "abd":
        _events(w[h], _resumed(w[h], 20, 2))
    disk = DiskWatch({}, ["j"])
    path = str(w["d"] / "checkpoints" / f"step-{20:010d}.json")
    disk.manifests.append(Manifest("d", "j", False, path, 1, 0.0, 0.0, 1, 20, "x", 0.0, 2))
    assert gc.committed_loads(w, EPOCHS, disk, "j", 3)[0] == []
    # the same path written again later (by epoch 2 itself) is not what was loaded
    disk.manifests.append(Manifest("d", "j", False, path, 2, 0.0, 0.0, 2, 20, "y", 0.0, 0))
    assert gc.committed_loads(w, EPOCHS, disk, "j", 3)[0] == []
    disk.manifests.append(Manifest("d", "j", False, path, 3, 0.0, 0.0, 1, 20, "z", 0.0, 0))
    (line,) = gc.committed_loads(w, EPOCHS, disk, "j", 3)[0]
    assert "d, node rank 2 at epoch 2, loaded node rank 0's shard" in line
    assert gc.committed_loads(w, EPOCHS, disk, "j", 3, any_shard=True)[0] == [], (
        "a torch-kind group's shards are interchangeable"
    )


def _placed(t: float, *members: str) -> Event:
    return Event(t=t, kind=Kind.PLACEMENT, job="j", data={"members": list(members)})


def test_a_restart_in_place_that_moved_members_is_reported() -> None:
    events = [_placed(1.0, "a", "b", "c"), _placed(6.0, "a", "b", "d")]
    lost = Injected("host_kill", "j", "c", 5.0, ("host_lost",), recovered_at=8.0)
    assert gc.memberships(events, [lost], "j") == []
    killed = Injected("sigkill", "j", "c", 5.0, ("executor_crash",), recovered_at=8.0)
    assert gc.memberships(events, [killed], "j") == [
        "sigkill on c: the members went from ['a', 'b', 'c'] to ['a', 'b', 'd']"
    ]
    shuffled = [_placed(1.0, "a", "b", "c"), _placed(6.0, "d", "b", "a")]
    assert gc.memberships(shuffled, [lost], "j") != []


# ---------------------------------------------------------------- elastic groups

SHRINK = [
    gc.Epoch(1, 10.0, ("a", "b", "c")),
    gc.Epoch(2, 20.0, ("a", "c")),  # b lost: c renumbered 2 -> 1
    gc.Epoch(3, 30.0, ("a", "c", "b")),  # b healed and grown back onto, at node rank 2
]


def test_an_elastic_group_renumbered_is_no_two_trainers_but_a_lost_member_training_on_is(
    tmp_path: Path,
) -> None:
    hosts = {str(tmp_path / h): h for h in "abcde"}
    fine = {"a": [(1, 11.0), (1, 21.0), (1, 31.0)], "b": [(2, 11.0), (5, 31.0)]}
    fine["c"] = [(3, 11.0), (3, 21.0), (3, 31.0)]
    assert gc.elastic_trainers(_sampler(tmp_path, fine), SHRINK, hosts, "j") == ([], 0)
    # the fixed-size check would call c (node rank 1 at epoch 2) and b (node rank 1 at
    # epoch 1) two trainers of one rank if b trained on: here b is no member of epoch 2
    stale = {**fine, "b": [(2, 11.0), (2, 21.5), (5, 31.0)]}
    lines, n = gc.elastic_trainers(_sampler(tmp_path, stale), SHRINK, hosts, "j")
    assert n == 1 and "pid 2 on b trained from 21.500" in lines[0], lines
    assert "after epoch 2 had begun at 20.000 without it" in lines[0]
    # two executors on one host at once (the grown-back b started beside the old one)
    twice = {**fine, "b": [(2, 11.0), (2, 31.0), (5, 31.0), (5, 32.0)]}
    lines, n = gc.elastic_trainers(_sampler(tmp_path, twice), SHRINK, hosts, "j")
    assert n == 1, lines
    assert any(
        "trained on b from 31.000 to 32.000" in ln and "(2, 'b'), (5, 'b')" in ln for ln in lines
    )
    stranger = {**fine, "e": [(6, 12.0)]}
    lines, n = gc.elastic_trainers(_sampler(tmp_path, stranger), SHRINK, hosts, "j")
    assert n == 1 and "pid 6 on e" in lines[0] and "without it" in lines[0]


def _elastic_shard(step: int, rank: int, epoch: int, nnodes: int) -> dict[str, Any]:
    manifest = {"step": step, "node_rank": rank, "nnodes": nnodes, "epoch": epoch}
    return {"kind": "checkpoint", "manifest": manifest}


def test_an_elastic_resume_of_a_step_committed_at_another_size_is_fine_and_a_partial_one_not(
    tmp_path: Path,
) -> None:
    w = {h: tmp_path / h for h in "abc"}
    _events(w["a"], _elastic_shard(20, 0, 1, 3), _elastic_shard(40, 0, 1, 3))
    _events(w["b"], _elastic_shard(20, 1, 1, 3))  # lost before its shard of 40
    _events(w["c"], _elastic_shard(20, 2, 1, 3), _elastic_shard(40, 2, 1, 3))
    for h in "ac":  # shrunk to a and c: step 20, committed at three
        _events(w[h], _resumed(w[h], 20, 2))
    _events(w["a"], _elastic_shard(60, 0, 2, 2))
    _events(w["c"], _elastic_shard(60, 1, 2, 2))
    for h in "acb":  # grown back: step 60, committed at two; b loads a's shard (a copy)
        _events(w[h], _resumed(w["a"], 60, 3))
    assert gc.elastic_loads(w, SHRINK, "j") == ([], 5)

    for h in "ac":
        _events(w[h], _resumed(w[h], 40, 4))
    lines, loads = gc.elastic_loads(w, [*SHRINK, gc.Epoch(4, 40.0, ("a", "c"))], "j")
    assert loads == 7 and len(lines) == 2, lines
    assert "loaded step 40 at epoch 4, which no earlier epoch committed" in lines[0]
    assert "{1: [0, 2]}" in lines[0]


def test_an_elastic_group_shrinks_to_its_survivors_in_order_and_restarts_in_place_whole() -> None:
    lost = Injected("host_kill", "j", "b", 15.0, ("host_lost",), recovered_at=22.0)
    killed = Injected("sigkill", "j", "a", 35.0, ("executor_crash",), recovered_at=42.0)
    eps = [*SHRINK, gc.Epoch(4, 36.0, ("a", "c", "b"))]
    assert gc.elastic_memberships(eps, [lost, killed], "j") == []
    assert gc.elastic_memberships([*SHRINK, gc.Epoch(4, 36.0, ("a", "c"))], [killed], "j") == [
        "sigkill on a: the members went from ['a', 'c', 'b'] to ['a', 'c']"
    ]
    shuffled = [SHRINK[0], gc.Epoch(2, 20.0, ("c", "a"))]
    assert gc.elastic_memberships(shuffled, [lost], "j") == [
        "host_kill on b: the members went from ['a', 'b', 'c'] to ['c', 'a']"
    ]
    frozen = Injected("sigstop", "j", "b", 15.0, ("executor_hang",), recovered_at=22.0)
    assert gc.elastic_memberships(SHRINK, [frozen], "j") == []
    assert gc.sizes(SHRINK, "j", 2, 3) == []
    (line,) = gc.sizes([*SHRINK, gc.Epoch(4, 40.0, ("c",))], "j", 2, 3)
    assert "epoch 4 started on ['c']: 1 members, min_hosts 2" in line


def _incident(n: int, t: float, host: str, cls: str, **extra: Any) -> list[Event]:
    """An incident's detected, decided (as ``extra["decided"]``, a new class), loaded and
    first step lines."""
    planned = cls == "grown"
    mark = {"phase": "detected", "class": cls, "fault_at": t, "last_step": 40, "planned": planned}
    lines = [Event(t=t, kind=Kind.INCIDENT, job="j", host=host, incident=n, data=mark)]
    decided = {"phase": "decided", "action": "shrink" if "decided" in extra else "restart"}
    if "decided" in extra:
        decided["class"] = extra["decided"]
    step = 40 if planned else 20
    for dt, data in ((0.5, decided), (1.0, {"phase": "loaded", "step": step})):
        lines.append(Event(t=t + dt, kind=Kind.INCIDENT, job="j", incident=n, data=data))
    lines.append(
        Event(t=t + 1.5, kind=Kind.INCIDENT, job="j", incident=n, data={"phase": "first_step"})
    )
    return lines


def test_a_shrink_caused_by_a_lost_host_records_the_fault_and_a_grow_is_no_false_failover() -> None:
    events = [
        *_incident(1, 10.0, "b", "host_lost", decided="shrunk"),
        *_incident(2, 20.0, "b", "grown"),
    ]
    report = "| 1 | j | b | shrunk |\n| 2 | j | b | grown |"
    lost = Injected("host_kill", "j", "b", 9.5, ("host_lost",), recovered_at=12.0)
    (m,), leftover, _ = inv.match_incidents(events, [lost], report)
    assert m.ok and m.incident is not None and m.incident.id == 1, m.why
    assert (m.incident.fault_class, m.incident.cause, m.incident.lost_steps) == (
        "shrunk",
        "host_lost",
        20,
    )
    assert leftover == [] and gc.grows(incidents(events), "j") == []
    # a shrink explains only a fault of its cause's class
    crashed = Injected("sigkill", "j", "b", 9.5, ("executor_crash",), recovered_at=12.0)
    (m,), leftover, _ = inv.match_incidents(events, [crashed], report)
    assert not m.ok and [i.id for i in leftover] == [1]
    # a grow that never ran again, or lost steps, is reported
    unfinished = [e for e in events if not (e.incident == 2 and e.data["phase"] == "first_step")]
    assert gc.grows(incidents(unfinished), "j") == ["j: grow (incident 2) never resolved"]
