"""What resolves an incident: the first step trained after the recovery. A console that took
over as the run ended (chaos, elastic seed 13: a console restarted at step 1190 of 1200, the
members reporting step 1200 at its reattach) sees no step past the one it found; the run's
last step, reported after the recovery, resolves it all the same."""

from __future__ import annotations

from console.supervise.incident import trained_past
from protocol.messages import Progress


def progress(step: int, steps: int = 1200) -> Progress:
    return Progress(step=step, steps=steps, loss=1.0, steps_per_s=1.0)


def test_a_step_past_the_one_resumed_from_resolves() -> None:
    assert trained_past(progress(41), 40)
    assert not trained_past(progress(40), 40), "the step resumed from is no step trained after"


def test_the_runs_last_step_resolves_even_when_it_is_the_one_resumed_from() -> None:
    assert trained_past(progress(1200), 1200)
    assert not trained_past(progress(1199), 1199 + 1)
