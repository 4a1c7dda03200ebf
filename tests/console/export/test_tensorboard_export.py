"""The console's TensorBoard export, read back with the tensorboard package's own reader: one
series per job across a crash, a restart in place and a console restart, each step once."""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
from support.fleetbed import EXECUTOR_ENV, job_table, local_host, run_until, until, write_inventory

pytest.importorskip("tensorboardX")
from tensorboard.backend.event_processing.event_accumulator import (
    EventAccumulator,
)
from tensorboardX import SummaryWriter

from console.controller import Controller
from console.export.tensorboard import (
    MARKS,
    ExportError,
    TensorBoardExport,
    Writer,
    open_tensorboard,
)
from console.inventory import load
from console.records.incidents import incidents
from console.records.journal import Kind, read
from console.states import JobState
from console.supervise.policy import Policy
from executors.kinds.torch.torch_kind import PROGRESS_ENV
from protocol.errors import ConfigError
from protocol.messages import Progress


def run_of(logdir: Path) -> EventAccumulator:
    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def steps(acc: EventAccumulator, tag: str) -> list[int]:
    return [s.step for s in acc.Scalars(tag)]


def strictly_rising(xs: list[int]) -> bool:
    return all(a < b for a, b in itertools.pairwise(xs))


def executor_losses(workdir: Path) -> dict[int, set[float]]:
    """Step -> the losses the executor itself wrote for it (its own events file, every epoch)."""
    out: dict[int, set[float]] = {}
    for line in (workdir / "events.jsonl").read_text().splitlines():
        e = json.loads(line)
        if e.get("kind") == "progress" and math.isfinite(e["loss"]):
            out.setdefault(e["step"], set()).add(e["loss"])
    return out


async def test_a_crash_and_a_console_restart_leave_one_series_with_each_step_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    offered: list[int] = []  # every Progress a console was given, in order (a job's history
    # keeps the newest 600: a loaded run sent more, and the first step had left it)
    given = Controller.on_progress

    def on_progress(self: Controller, sup: Any, msg: Progress) -> None:
        offered.append(msg.step)
        given(self, sup, msg)

    monkeypatch.setattr(Controller, "on_progress", on_progress)
    inventory = write_inventory(
        tmp_path / "inventory.toml",
        hosts={"a": local_host(tmp_path / "a"), "b": local_host(tmp_path / "b", role="spare")},
        jobs={
            "j": {"host": "a", "spares": ["b"], **job_table(steps=800, checkpoint_every_steps=200)}
        },
        tensorboard_dir="tb",  # beside the inventory
    )
    env = {h: {**EXECUTOR_ENV, PROGRESS_ENV: "0"} for h in ("a", "b")}  # a Progress every step
    logdir = tmp_path / "tb" / "j"
    ctl = Controller(load(inventory), Policy.AUTO, executor_env=env)
    sup = ctl.jobs["j"]
    # Killed well past a checkpoint (every 200 steps), well before the next: the restart
    # trains again the steps between.
    task = await run_until(ctl, lambda: sup.step >= 250, 90, "step 250")
    killed_at = sup.step
    os.kill(int((tmp_path / "a" / "jobs" / "j" / "executor.pid").read_text()), signal.SIGKILL)
    await until(
        lambda: sup.rec.epoch == 2 and sup.incident is None and sup.step > killed_at + 40,
        60,
        "the restart in place to train past the kill",
    )
    task.cancel()  # the console quits; the executor trains on under its lease
    await asyncio.gather(task, return_exceptions=True)
    await ctl.close()
    first_console = json.loads((logdir / MARKS).read_text())["progress"]
    assert any(b <= a for a, b in itertools.pairwise(offered)), (
        "the console was offered steps again after the restart (else this proves nothing)"
    )
    assert offered[0] == 1, "it saw every step"

    again = Controller(load(inventory), Policy.AUTO, executor_env=env)
    assert await asyncio.wait_for(again.run(), 120) == {"j": JobState.FINISHED}
    await again.close()

    acc = run_of(logdir)
    loss = steps(acc, "progress/loss")
    assert strictly_rising(loss), f"a step written twice, or out of order: {loss}"
    assert loss == sorted(set(offered)), "each step either console was told of, once"
    assert loss[-1] == 800, "the series runs to the job's last step"
    assert any(s <= killed_at for s in loss) and any(s > first_console for s in loss)
    assert steps(acc, "progress/steps_per_s") == loss
    assert len(list(logdir.glob("events.out.tfevents.*"))) == 2, "one file per console"
    told = executor_losses(tmp_path / "a" / "jobs" / "j")
    for s in acc.Scalars("progress/loss"):
        assert any(math.isclose(s.value, x, rel_tol=1e-6) for x in told[s.step]), s

    events = list(read(tmp_path / "state" / "journal.jsonl"))
    stalls: dict[int, float] = {}
    for e in events:
        if e.kind is Kind.CHECKPOINT:
            stalls.setdefault(e.data["step"], e.data["stall_s"])
    written = acc.Scalars("checkpoint/stall_s")
    assert strictly_rising([s.step for s in written])
    assert [s.step for s in written] == sorted(stalls), "every checkpoint the journal holds"
    for s in written:
        assert math.isclose(s.value, stalls[s.step], rel_tol=1e-6, abs_tol=1e-9)
    assert all(s.value > 0 for s in acc.Scalars("checkpoint/bytes"))
    assert any(tag.startswith("replica/b/lag_s") for tag in acc.Tags()["scalars"])

    (inc,) = incidents(events)
    assert inc.lost_steps is not None
    assert inc.lost_steps > 0
    (lost,) = acc.Scalars("incidents/lost_steps")
    assert lost.value == inc.lost_steps
    assert lost.step == inc.last_step
    (text,) = acc.Tensors("incidents/detected/text_summary")
    assert b"executor_crash" in text.tensor_proto.string_val[0]


class FailingWriter:
    """A real writer whose disk fails after ``good`` scalars (a console dying mid-write)."""

    def __init__(self, real: Writer, good: int) -> None:
        self.real, self.left = real, good

    def add_scalar(self, tag: str, scalar_value: float, global_step: int, walltime: float) -> None:
        if self.left == 0:
            raise OSError(28, "No space left on device")
        self.left -= 1
        self.real.add_scalar(tag, scalar_value, global_step=global_step, walltime=walltime)

    def add_text(self, tag: str, text_string: str, global_step: int, walltime: float) -> None:
        self.real.add_text(tag, text_string, global_step=global_step, walltime=walltime)

    def close(self) -> None:
        self.real.close()


def progress(step: int) -> Progress:
    return Progress(step=step, steps=100, loss=1.0 + step / 100, steps_per_s=5.0)


async def test_a_write_cut_short_leaves_a_gap_never_a_step_written_twice(tmp_path: Path) -> None:
    """The marks are saved before the points under them are written: the next console skips
    what a dying one may have written, at the price of a gap."""
    problems: list[str] = []
    dying = TensorBoardExport(
        tmp_path, lambda d: FailingWriter(SummaryWriter(str(d)), 3 * 20), problems.append
    )
    for s in range(1, 41):
        dying.progress("j", progress(s))
    await dying.close()
    assert len(problems) == 1 and "No space left on device" in problems[0], problems
    # Written: steps 1..20 (three scalars each), and no more; marked: up to 40.

    second = open_tensorboard(tmp_path, problems.append)
    for s in range(25, 61):  # a resume from a checkpoint at 24
        second.progress("j", progress(s))
    await second.close()
    written = steps(run_of(tmp_path / "j"), "progress/loss")
    assert written == [*range(1, 21), *range(41, 61)]


def test_without_tensorboardx_the_export_is_one_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "tensorboardX", None)
    with pytest.raises(ExportError) as e:
        open_tensorboard(tmp_path / "tb", print)
    assert "tensorboardX is not installed" in str(e.value)
    assert "\n" not in str(e.value)
    assert not (tmp_path / "tb").exists()


async def test_a_tensorboard_dir_that_cannot_be_written_is_one_alert_and_the_job_runs(
    tmp_path: Path,
) -> None:
    (tmp_path / "afile").write_text("not a folder")
    inventory = write_inventory(
        tmp_path / "inventory.toml",
        hosts={"a": local_host(tmp_path / "a")},
        jobs={"j": {"host": "a", **job_table(steps=60)}},
        tensorboard_dir=str(tmp_path / "afile" / "tb"),
    )
    ctl = Controller(load(inventory), Policy.AUTO, executor_env={"a": dict(EXECUTOR_ENV)})
    said: list[Any] = []
    ctl.alert_sinks.append(said.append)
    assert await asyncio.wait_for(ctl.run(), 90) == {"j": JobState.FINISHED}
    await ctl.close()
    alerts = [
        e.msg
        for e in read(tmp_path / "state" / "journal.jsonl")
        if e.kind is Kind.ALERT and "tensorboard" in e.msg
    ]
    assert alerts == [
        f"tensorboard_dir {tmp_path / 'afile' / 'tb'} is not writable (Not a directory): no metrics are exported"
    ]
    assert [m for m in said if "tensorboard" in m] == alerts, "the alert sinks hear it too"


def test_an_empty_tensorboard_dir_is_one_config_error(tmp_path: Path) -> None:
    inventory = write_inventory(
        tmp_path / "inventory.toml",
        hosts={"a": local_host(tmp_path / "a")},
        jobs={"j": {"host": "a", **job_table()}},
        tensorboard_dir="",
    )
    with pytest.raises(ConfigError) as e:
        load(inventory)
    assert "console.tensorboard_dir" in str(e.value)
    assert "\n" not in str(e.value)
    assert load(write_inventory(inventory, {}, {})).tensorboard_dir is None, "default: off"
