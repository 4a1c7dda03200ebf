"""Where a group supervisor finds its members at console start: the record's members; for a
job on one host, the record a single host's supervisor wrote (its host, no members) is a
group of one on that host (issue 30: a single-host job supervised as a group of one
reattached nothing: it retired the executor the last console left training, and started
another). No process is started."""

from __future__ import annotations

from pathlib import Path

from support.jobbed import Calls, services

from console.supervise.group.supervisor import GroupSupervisor


def test_a_one_host_record_is_a_group_of_one_on_its_host(tmp_path: Path) -> None:
    svc = services(tmp_path, Calls())
    rec = svc.store.job("j")
    rec.host, rec.epoch = "b", 3  # it failed over from a to b under an earlier console
    g = GroupSupervisor(svc, "j")
    assert g.members == ["b"]
    assert g.shards() == [0]


def test_a_groups_record_names_its_members_and_never_its_host_alone(tmp_path: Path) -> None:
    svc = services(tmp_path, Calls())
    rec = svc.store.job("g")
    rec.host = "b"  # no members recorded: the inventory's, not a group of one on b
    assert GroupSupervisor(svc, "g").members == ["a", "b"]
    rec.members = ["c", "b"]
    assert GroupSupervisor(svc, "g").members == ["c", "b"]
