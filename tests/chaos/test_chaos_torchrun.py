"""A chaos seed with a torchrun job (long): job j runs ``torchrun --standalone --nproc-per-node
2`` under the command kind (chaos.torchrun) on the chaos fleet, and meets, one at a time, the
faults that end its executor or cut its host off while its workers, in a session of their own,
would train on: executor SIGKILL, SIGSTOP, SIGSTOP past the lease (cut off, then continued),
partition, host kill, console restart. It must end with the uninterrupted run's state (hashed
here from the final checkpoint), and /proc must show no process of an ended epoch beside the
next epoch's, having seen every epoch that trained."""

from __future__ import annotations

import shutil

import pytest

from chaos.episode import Config, Episode
from chaos.runner import summary

SEED = 5
KINDS = ["sigkill", "sigstop", "sigstop_past_lease", "partition", "host_kill", "console_restart"]
STEPS = 6000
GAP = (60, 200)


@pytest.mark.chaos
@pytest.mark.long
@pytest.mark.skipif(shutil.which("ip") is None, reason="needs iproute2 (network namespaces)")
def test_a_torchrun_job_under_chaos_leaves_no_old_epoch_beside_a_new_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    lines: list[str] = []
    cfg = Config(
        seed=SEED, kinds=list(KINDS), steps=STEPS, gap_steps=GAP, torchrun=1, log=lines.append
    )
    result = Episode(cfg).run()
    with capsys.disabled():
        print("\n" + "\n".join(lines) + "\n" + summary([result], result.wall_s))
    assert result.violations == []
    assert sorted(f.kind for f in result.faults) == sorted(KINDS), result.skipped
    assert all(m.ok for m in result.matches)
    assert result.epoch_samples > 0 and result.inconclusive == []
    assert result.stale_samples == 0 and result.stale_files == 0
    assert result.false_failovers == 0
