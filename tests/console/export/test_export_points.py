"""Exported replica lag in steps is counted as the Jobs view counts it: from the job's newest
checkpoint, so a replica of that checkpoint lags 0 steps however far training went on since
(it was the live step minus the replica's)."""

from __future__ import annotations

from console.export.points import Translate
from console.records.journal import Event, Kind
from protocol.messages import Progress


def _progress(step: int) -> Progress:
    return Progress(step=step, steps=100, loss=1.0, steps_per_s=10.0, tokens_per_s=0.0)


def test_a_replica_of_the_newest_checkpoint_lags_zero_steps() -> None:
    t = Translate()
    t.progress("j", _progress(35), 1.0)
    t.event(Event(t=2.0, kind=Kind.CHECKPOINT, job="j", host="a", msg="", data={"step": 40}))
    t.progress("j", _progress(57), 3.0)
    (fresh,) = t.event(
        Event(t=4.0, kind=Kind.REPLICA, job="j", host="b", msg="", data={"ok": True, "step": 40})
    )
    assert fresh.scalars["replica/b/lag_steps"] == 0.0, "training on past it is no lag"
    t.event(Event(t=5.0, kind=Kind.CHECKPOINT, job="j", host="a", msg="", data={"step": 60}))
    (behind,) = t.event(
        Event(t=6.0, kind=Kind.REPLICA, job="c", host="b", msg="", data={"ok": True, "step": 40})
    )
    assert "replica/b/lag_steps" not in behind.scalars, "another job's checkpoints are not c's"
    (late,) = t.event(
        Event(t=6.0, kind=Kind.REPLICA, job="j", host="c", msg="", data={"ok": True, "step": 40})
    )
    assert late.scalars["replica/c/lag_steps"] == 20.0
