"""How many rank processes a multi-host job starts per member, and its backend, by default."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from support.fleetbed import local_host, write_inventory
from support.groupbed import controller, group_job

from console.supervise.group.meeting import PORTS, next_port
from console.supervise.supervisor import Supervisor


def group(tmp_path: Path, gpus: tuple[int, int, int], **job: Any) -> Supervisor:
    tmp_path.mkdir(parents=True, exist_ok=True)
    hosts = {n: local_host(tmp_path / n, gpus=g) for n, g in zip("abc", gpus, strict=True)} | {
        "d": local_host(tmp_path / "d", role="spare")
    }
    inv = write_inventory(tmp_path / "inventory.toml", hosts=hosts, jobs={"j": group_job(**job)})
    ctl = controller(inv)
    ctl.lock.release()
    sup = ctl.jobs["j"]
    assert isinstance(sup, Supervisor)
    return sup


def test_the_command_kind_starts_one_rank_per_gpu_of_the_smallest_member(tmp_path: Path) -> None:
    cmd = {"executor": "command", "command": {"argv": ["python", "train.py"]}}
    sup = group(tmp_path, (8, 4, 8), **cmd)
    assert sup.meeting.procs_per_host(["a", "b", "c"]) == 4
    assert sup.meeting.backend(["a", "b", "c"]) == "nccl"


def test_the_torch_kind_and_hosts_without_gpus_start_one(tmp_path: Path) -> None:
    assert group(tmp_path / "t", (8, 8, 8)).meeting.procs_per_host(["a", "b", "c"]) == 1
    sup = group(tmp_path / "c", (0, 0, 0), executor="command", command={"argv": ["x"]})
    assert sup.meeting.procs_per_host(["a", "b", "c"]) == 1
    assert sup.meeting.backend(["a", "b", "c"]) == "gloo"


def test_an_explicit_procs_per_host_wins(tmp_path: Path) -> None:
    cmd = {"executor": "command", "command": {"argv": ["x"]}, "procs_per_host": 2}
    assert group(tmp_path, (8, 8, 8), **cmd).meeting.procs_per_host(["a", "b", "c"]) == 2


def test_each_epoch_s_master_port_differs_from_the_last_whatever_is_drawn() -> None:
    low, high = PORTS
    for last in (low, low + 1, (low + high) // 2, high - 2, high - 1):
        for drawn in (low, last - 1, last, last + 1, high - 2):
            if not low <= drawn <= high - 2:
                continue
            port = next_port(last, lambda _a, _b, d=drawn: d)
            assert port != last and low <= port < high, (last, drawn, port)
    assert next_port(None, lambda _a, _b: low) == low
