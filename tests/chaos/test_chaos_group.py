"""The short multi-host chaos seed of the default suite: a three-member job and two spares on
five sshd hosts in routed network namespaces, under ``hotspare run --policy auto``, and a few
faults in a seeded order, one at a time, rank 0's host among the victims (see chaos.group).
More faults and seeds run in the long mode (scripts/chaos --group).

The elastic seed (long: the default suite proves shrink and grow over sshd in
tests/console/supervise/group/test_elastic_ssh.py, and the elastic checks in test_group_checks.py): the same job
with min_hosts 2 and deterministic_reduce on its three hosts alone, rank 0's host killed (the
group shrinks to b and c, renumbered), healed and grown back onto, then an executor killed."""

from __future__ import annotations

import pytest
from support import netbed

from chaos.episode import Config
from chaos.group import ELASTIC, GroupEpisode
from chaos.runner import summary

SEED = 2
KINDS = ["host_kill", "sigkill"]
SPEC = {"steps": 240, "checkpoint_every_steps": 20}
"""groupbed.group_job's own: the uninterrupted run is the one the other group tests compute."""
ELASTIC_SEED = 2
ELASTIC_SPEC = {"steps": 400, "checkpoint_every_steps": 20, **ELASTIC}
"""tests/console/supervise/group/test_elastic_ssh.py's job: its uninterrupted run is computed once per session."""


@pytest.mark.chaos
@pytest.mark.skipif(
    netbed.unavailable() is not None or netbed.forward_blocked() is not None,
    reason=str(netbed.unavailable() or netbed.forward_blocked()),
)
@pytest.mark.long  # the suite's one short seed is tests/chaos/test_chaos.py; multi-host faults: tests/console/supervise/group
def test_a_seeded_multi_host_chaos_run_keeps_every_guarantee(
    capsys: pytest.CaptureFixture[str],
) -> None:
    lines: list[str] = []
    cfg = Config(seed=SEED, kinds=list(KINDS), gap_steps=(10, 30), log=lines.append)
    result = GroupEpisode(cfg, SPEC).run()
    with capsys.disabled():
        print("\n" + "\n".join(lines) + "\n" + summary([result], result.wall_s))
    assert result.violations == []
    assert sorted(f.kind for f in result.faults) == sorted(KINDS), result.skipped
    assert any(f.note.startswith("node rank 0") for f in result.faults), "rank 0 among the victims"
    assert all(m.ok for m in result.matches)
    assert result.loads >= 3, "the members resumed from committed shards, each one checked"
    assert result.false_failovers == 0
    assert result.two_trainers == 0 and result.stale_files == 0


@pytest.mark.chaos
@pytest.mark.long
@pytest.mark.skipif(
    netbed.unavailable() is not None or netbed.forward_blocked() is not None,
    reason=str(netbed.unavailable() or netbed.forward_blocked()),
)
def test_a_seeded_elastic_chaos_run_shrinks_grows_back_and_keeps_every_guarantee(
    capsys: pytest.CaptureFixture[str],
) -> None:
    lines: list[str] = []
    cfg = Config(seed=ELASTIC_SEED, kinds=list(KINDS), gap_steps=(10, 30), log=lines.append)
    result = GroupEpisode(cfg, ELASTIC_SPEC, elastic=True).run()
    with capsys.disabled():
        print("\n" + "\n".join(lines) + "\n" + summary([result], result.wall_s))
    assert result.violations == []
    assert sorted(f.kind for f in result.faults) == sorted(KINDS), result.skipped
    assert all(m.ok for m in result.matches)
    lost = next(m for m in result.matches if m.fault.kind == "host_kill")
    assert lost.fault.note.startswith("node rank 0"), "rank 0's host lost: the rest renumbered"
    assert lost.incident is not None
    assert (lost.incident.fault_class, lost.incident.cause) == ("shrunk", "host_lost")
    assert "| grown |" in result.report, "the healed host was grown back onto"
    assert result.loads >= 5, "the shrunk group and the grown one resumed from committed shards"
    assert result.false_failovers == 0 and result.leftover == []
    assert result.two_trainers == 0 and result.stale_files == 0
