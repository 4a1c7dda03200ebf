"""The short chaos seed of the default suite: one fleet (four sshd hosts, three of them behind
network namespaces), one torch job under ``hotspare run --policy auto``, and four kinds of
fault in a seeded order, one at a time, each checked against the guarantees (see
chaos.invariants and chaos.fencing): a damaged checkpoint met and skipped on a restart in place,
a run frozen past its lease and failed over (continued, it trains and publishes nothing), its
host lost and a damaged replica skipped on the failover, a NaN rolled back. The same seed with
all fourteen kinds is marked ``long`` (scripts/test-long); overlapping faults, two jobs and the
other fencing faults run in the long mode (scripts/chaos)."""

from __future__ import annotations

import shutil

import pytest

from chaos.episode import Config, Episode
from chaos.runner import summary

SEED = 3
KINDS = [
    "corrupt_checkpoint",  # SIGKILL, then the newest checkpoint damaged before the restart
    "sigstop",
    "sigstop_past_lease",  # frozen and cut off past its lease, then continued: no step, no publish
    "corrupt_replica",  # the host killed (sshd and all under it), then the spare's replica damaged
    "flap",
    "partition",
    "console_restart",
    "gpu_fail",
    "disk_full",
    "nan",
    "oom",
    "second_console",  # refused: exit 2, one line naming the holder; the first goes on
    "console_restart_partitioned",  # restarted while its job's host is cut off: waits the lease out
    "wall_clock_step",  # the console's wall clock stepped: leases keep to the monotonic clock
]
"""Plain SIGKILL and host kill (parts of the two above) run on their own in the long mode."""
SHORT = ["corrupt_checkpoint", "sigstop_past_lease", "corrupt_replica", "nan"]
"""The three recovery paths (a restart in place, a failover once the lease is out, a failover
from a lost host) and a rollback, each loading a checked checkpoint. A plain partition and a
console restarted while its job's host is cut off are the long seed's: the suite proves them
on their own (test_elastic_ssh, a member cut off; test_console_fencing, on the same lease
bound)."""
SHORT_STEPS = 4500
"""The five (with console_restart_partitioned), seen through by step 2500 alone on this machine;
more steps for a loaded one. Kept with four: the NaN's step and the gaps before the first three
faults are the five's (the same draws of the seed)."""
STEPS = 9000
GAP = (60, 200)
"""Steps trained between faults. All twelve were seen through by step 4500 alone on this
machine; with two busy loops beside the suite the job ended at 7000 before the last two of
fourteen were injected, hence 9000."""


@pytest.mark.chaos
# five kinds (console_restart_partitioned too): 51 s alone here. Fourteen: 130 s alone; beside
# the other worker's tests on two cores, the fleet's run ended after about 225 s and its
# uninterrupted baseline after 300 s.
@pytest.mark.timeout(600)
@pytest.mark.skipif(shutil.which("ip") is None, reason="needs iproute2 (network namespaces)")
@pytest.mark.parametrize(
    ("kinds", "steps"),
    [
        pytest.param(SHORT, SHORT_STEPS, id="short"),
        pytest.param(KINDS, STEPS, id="fourteen", marks=pytest.mark.long),
    ],
)
def test_a_seeded_chaos_run_keeps_every_guarantee(
    kinds: list[str], steps: int, capsys: pytest.CaptureFixture[str]
) -> None:
    lines: list[str] = []
    cfg = Config(seed=SEED, kinds=list(kinds), steps=steps, gap_steps=GAP, log=lines.append)
    result = Episode(cfg).run()
    with capsys.disabled():
        print("\n" + "\n".join(lines) + "\n" + summary([result], result.wall_s))
    assert result.violations == []
    assert sorted(f.kind for f in result.faults) == sorted(kinds), result.skipped
    assert all(m.ok for m in result.matches)
    assert result.corrupt_skips >= 1, "a damaged checkpoint was met and skipped"
    assert result.loads >= 3, "resumes and a rollback loaded checkpoints, each one checked"
    assert result.false_failovers == 0
    assert result.two_trainers == 0 and result.stale_files == 0
