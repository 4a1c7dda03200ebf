"""The multi-host checks themselves can fail: each is shown the violation it must report and
the same scene without it (a sampler's record, executors' events.jsonl, the journal)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from chaos import group_checks as gc
from chaos.disk import DiskWatch, Manifest
from chaos.faults import Injected
from chaos.procs import Sampler, Trainer, Window
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
