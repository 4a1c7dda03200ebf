"""The torch kind's run identity, read where user code reads it: a workload's factory and its
``batch`` see ``HOTSPARE_*`` in the executor process's own environment (the kind's runner
trains in that process). The workload is the built-in charlm, wrapped to write down what it
sees; the second start resumes the first's checkpoint."""

from __future__ import annotations

import os
import sys
import types
from pathlib import Path
from typing import Any

import msgspec
import pytest
from support.helpers import TINY_CONFIG

from executors.agent.control import Control
from executors.agent.inject import Injections
from executors.agent.run_env import EPOCH, JOB, NAMES, RESUMED_FROM_STEP, RUN_ID
from executors.kinds.torch.torch_kind import TorchKind
from executors.kinds.torch.workloads import charlm
from protocol.messages import ExecutorMessage, Finished, Resumed, Start
from protocol.spec import JobSpec

PROBE = "hotspare_run_env_probe"


def spec(steps: int) -> JobSpec:
    return JobSpec(
        name="envjob",
        workload=f"{PROBE}:build",
        steps=steps,
        seed=3,
        checkpoint_every_steps=5,
        config=dict(TINY_CONFIG),
    )


@pytest.fixture
def seen(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, dict[str, str | None]]]:
    """What the probe workload saw of the run's variables, at its factory and at each batch."""
    for name in NAMES:
        monkeypatch.delenv(name, raising=False)  # and put back as they were after the test
    log: list[tuple[str, dict[str, str | None]]] = []

    def snapshot(where: str) -> None:
        log.append((where, {k: os.environ.get(k) for k in sorted(NAMES)}))

    def build(config: dict[str, Any], ctx: Any) -> charlm.CharLM:
        snapshot("factory")
        w = charlm.build(config, ctx)
        batch = w.batch

        def probed(index: int) -> Any:
            snapshot("batch")
            return batch(index)

        w.batch = probed  # type: ignore[method-assign]
        return w

    probe = types.ModuleType(PROBE)
    probe.build = build  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, PROBE, probe)
    return log


def train(workdir: Path, steps: int, epoch: int) -> list[ExecutorMessage]:
    events: list[ExecutorMessage] = []
    control = Control(epoch=epoch, run_id="0123abcd")
    runner = TorchKind().runner(
        spec(steps), workdir, events.append, control=control, device="cpu", injections=Injections()
    )
    runner.run()
    return events


def test_the_torch_kind_sets_the_run_in_the_executor_process_environment(
    tmp_path: Path, seen: list[tuple[str, dict[str, str | None]]]
) -> None:
    first = train(tmp_path, steps=10, epoch=1)
    assert [e.step for e in first if isinstance(e, Resumed)] == [0]
    assert any(isinstance(e, Finished) for e in first)
    run = {RUN_ID: "0123abcd", JOB: "envjob"}
    factory, *batches = seen
    assert factory == ("factory", {**run, EPOCH: "1", RESUMED_FROM_STEP: None})
    assert batches and all(
        b == ("batch", {**run, EPOCH: "1", RESUMED_FROM_STEP: "0"}) for b in batches
    )

    seen.clear()
    second = train(tmp_path, steps=13, epoch=2)
    assert [e.step for e in second if isinstance(e, Resumed)] == [10]
    factory, *batches = seen
    assert factory == ("factory", {**run, EPOCH: "2", RESUMED_FROM_STEP: None}), (
        "the first start's resumed-from step is not left over for the factory"
    )
    assert len(batches) == 3
    assert all(b == ("batch", {**run, EPOCH: "2", RESUMED_FROM_STEP: "10"}) for b in batches)


def test_a_start_from_an_older_console_decodes_with_no_run_id() -> None:
    start = Start(spec=spec(1), epoch=2, run_id="abc")
    raw = msgspec.json.decode(msgspec.json.encode(start))
    del raw["run_id"]
    old = msgspec.json.decode(msgspec.json.encode(raw), type=Start)
    assert (old.epoch, old.run_id) == (2, "")
