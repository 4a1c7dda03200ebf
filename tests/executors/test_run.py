"""``hotspare-executor run``: real torch training in subprocesses, killed and resumed for real."""

from __future__ import annotations

import json
import math
import os
import random
import signal
from pathlib import Path

import pytest
from support.helpers import ExecutorProcess, env_with, run_job, wait_for, write_spec

from executors import exitcodes

# the module-wide reference is made once, on the one worker that runs the whole module
pytestmark = pytest.mark.xdist_group(__name__)


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The tiny job run once, uninterrupted: its spec and final params_sha256."""
    d = tmp_path_factory.mktemp("baseline")
    spec = write_spec(d / "job.toml")
    proc = run_job(spec, d / "work")
    assert proc.returncode == 0, proc.stderr
    return spec, proc.events[-1]["params_sha256"]


def test_json_output_ends_with_the_finished_line(
    baseline: tuple[Path, str], tmp_path: Path
) -> None:
    spec, digest = baseline
    proc = run_job(spec, tmp_path / "work")
    assert proc.returncode == 0, proc.stderr
    last = proc.events[-1]
    assert set(last) == {"kind", "step", "params_sha256"}
    assert last == {"kind": "finished", "step": 80, "params_sha256": digest}, (
        "training is not deterministic"
    )
    kinds = {e["kind"] for e in proc.events}
    assert {"resumed", "progress", "checkpoint", "finished"} <= kinds
    manifests = sorted((tmp_path / "work" / "checkpoints").glob("step-*.json"))
    assert [m.name for m in manifests] == [f"step-{s:010d}.json" for s in (60, 70, 80)], (
        "keep_checkpoints = 3"
    )
    logged = [
        json.loads(line) for line in (tmp_path / "work" / "events.jsonl").read_text().splitlines()
    ]
    assert logged[-1] == last


def test_rerun_of_a_finished_workdir_resumes_at_the_end(
    baseline: tuple[Path, str], tmp_path: Path
) -> None:
    spec, digest = baseline
    assert run_job(spec, tmp_path / "w").returncode == 0
    again = run_job(spec, tmp_path / "w")
    assert again.of("resumed")[0]["step"] == 80
    assert again.events[-1]["params_sha256"] == digest


def test_a_sigkill_inside_a_checkpoint_write_resumes_bit_exact(
    baseline: tuple[Path, str], tmp_path: Path
) -> None:
    """The default suite's one: a kill that lands while a checkpoint is being written (its temp
    file on disk), then a resume from the one before, bit-identical at the end."""
    spec, digest = baseline
    work = tmp_path / "work"
    ckpts = work / "checkpoints"
    env = env_with(HOTSPARE_INJECT="slow_write@0.004")  # a write lasts ~0.1 s, so one can be hit
    proc = ExecutorProcess(["run", "--spec", str(spec), "--workdir", str(work), "--json"], env=env)
    proc.wait_event(lambda e: e["kind"] == "checkpoint", 60, "a first checkpoint")
    wait_for(lambda: any(ckpts.glob(".*.tmp")), 60, "a checkpoint write in progress")
    proc.proc.send_signal(signal.SIGKILL)
    rc, _ = proc.finish()
    assert rc == -signal.SIGKILL
    torn = sorted(p.name for p in ckpts.glob(".*.tmp"))
    assert torn, "the kill landed inside a checkpoint write"
    final = run_job(spec, work, env=env)
    assert final.returncode == 0, final.stderr
    assert final.of("resumed")[0]["step"] > 0, "resumed from the checkpoint before the torn one"
    assert final.events[-1]["params_sha256"] == digest
    assert not any(ckpts.glob(".*.tmp")), "the torn write's leftovers are cleaned up"


@pytest.mark.long
def test_sigkill_at_random_instants_resumes_bit_exact(
    baseline: tuple[Path, str], tmp_path: Path
) -> None:
    """Six SIGKILLs: three inside steps, three inside checkpoint writes; the end is bit-identical."""
    spec, digest = baseline
    work = tmp_path / "work"
    ckpts = work / "checkpoints"
    rnd = random.Random(20261130)
    env = env_with(HOTSPARE_INJECT="slow_write@0.004")  # a write lasts ~0.1 s, so one can be hit
    resumed_from: list[int] = []
    for kill in range(6):
        proc = ExecutorProcess(
            ["run", "--spec", str(spec), "--workdir", str(work), "--json"], env=env
        )
        start = proc.wait_event(lambda e: e["kind"] == "resumed", 60, "resumed")["step"]
        resumed_from.append(start)
        if kill % 2 == 0:
            target = start + rnd.randint(1, 9)
            proc.wait_event(
                lambda e, t=target: e["kind"] == "progress" and e["step"] >= t, 60, f"step {target}"
            )
        else:
            wait_for(lambda: any(ckpts.glob(".*.tmp")), 60, "a checkpoint write in progress")
        proc.proc.send_signal(signal.SIGKILL)
        rc, _ = proc.finish()
        assert rc == -signal.SIGKILL
        if kill % 2 == 1:
            assert any(ckpts.glob(".*.tmp")), "the kill landed inside a checkpoint write"
    final = run_job(spec, work, env=env)
    assert final.returncode == 0, final.stderr
    assert final.events[-1]["params_sha256"] == digest
    assert resumed_from == sorted(resumed_from) and resumed_from[-1] > 0, resumed_from
    assert not any(ckpts.glob(".*.tmp")), "leftovers of killed writes are cleaned up"


def test_sigterm_checkpoints_the_current_step_and_exits_cleanly(tmp_path: Path) -> None:
    long_spec = write_spec(tmp_path / "long.toml", steps=100_000)
    work = tmp_path / "work"
    proc = ExecutorProcess(["run", "--spec", str(long_spec), "--workdir", str(work), "--json"])
    proc.wait_event(lambda e: e["kind"] == "progress" and e["step"] >= 13, 60, "step 13")
    proc.proc.send_signal(signal.SIGTERM)
    rc, err = proc.finish()
    assert rc == exitcodes.PREEMPTED, err
    stopped = proc.of("stopped")[-1]
    assert stopped["reason"] == "preempted"
    assert stopped["checkpoint_step"] == stopped["step"], "the checkpoint is at the current step"
    assert proc.of("fault")[-1]["fault"] == "preempted"
    newest = sorted((work / "checkpoints").glob("step-*.json"))[-1]
    assert json.loads(newest.read_text())["step"] == stopped["step"]
    # Resume to a few steps past the stop; an uninterrupted run to there must match (steps may change).
    end = stopped["step"] + 5
    short = write_spec(tmp_path / "short.toml", steps=end)
    rest = run_job(short, work)
    assert rest.of("resumed")[0]["step"] == stopped["step"], "0 lost steps"
    reference = run_job(short, tmp_path / "reference")
    assert rest.events[-1] == reference.events[-1] == {**reference.events[-1], "step": end}


@pytest.mark.long  # the suite halves it at the same two OOMs (the early run of the test below)
def test_injected_oom_halves_the_micro_batch_and_keeps_the_global_batch(tmp_path: Path) -> None:
    spec = write_spec(tmp_path / "job.toml", steps=30)
    proc = run_job(spec, tmp_path / "work", env=env_with(HOTSPARE_INJECT="oom@5,oom@12"))
    assert proc.returncode == 0, proc.stderr
    faults = [e for e in proc.of("fault") if e["fault"] == "oom"]
    assert [f["step"] for f in faults] == [5, 12]
    last = proc.of("progress")[-1]
    assert (last["micro_batch"], last["accumulation"]) == (2, 4)
    assert last["micro_batch"] * last["accumulation"] == 8, "global batch unchanged"
    assert math.isfinite(last["loss"])
    assert proc.events[-1]["kind"] == "finished"


def test_an_oom_after_gradients_accumulated_leaves_none_of_them_behind(tmp_path: Path) -> None:
    """An OOM in the last micro-batch of a step, once the one before it has accumulated its
    gradients: the step is redone from clean gradients (and RNG), so the run ends exactly as
    the one whose OOM at that step came before anything accumulated."""
    spec = write_spec(tmp_path / "job.toml", steps=30)
    early = run_job(spec, tmp_path / "early", env=env_with(HOTSPARE_INJECT="oom@5,oom@12"))
    late = run_job(spec, tmp_path / "late", env=env_with(HOTSPARE_INJECT="oom@5,oom_late@12"))
    assert early.returncode == 0 and late.returncode == 0, late.stderr
    assert [f["step"] for f in late.of("fault") if f["fault"] == "oom"] == [5, 12]
    assert (late.of("progress")[-1]["micro_batch"], late.of("progress")[-1]["accumulation"]) == (
        2,
        4,
    )
    assert late.events[-1]["params_sha256"] == early.events[-1]["params_sha256"]


def test_injected_nan_rolls_back_to_the_last_checkpoint(tmp_path: Path) -> None:
    spec = write_spec(tmp_path / "job.toml", steps=40)
    proc = run_job(spec, tmp_path / "work", env=env_with(HOTSPARE_INJECT="nan@25"))
    assert proc.returncode == 0, proc.stderr
    (nan,) = [e for e in proc.of("fault") if e["fault"] == "nan"]
    assert nan["step"] == 25
    at = proc.events.index(nan)
    # the rollback is the next resume; a checkpoint written before the fault may be reported
    # in between (its write is asynchronous), but no step is trained
    j = next(j for j in range(at + 1, len(proc.events)) if proc.events[j]["kind"] == "resumed")
    assert {e["kind"] for e in proc.events[at + 1 : j]} <= {"checkpoint", "log"}
    after = proc.events[j]
    assert after["step"] == 20, "rolled back to checkpoint 20"
    assert after["checkpoint"].endswith("step-0000000020.pt")
    assert math.isfinite(proc.of("progress")[-1]["loss"])
    assert proc.events[-1] == {**proc.events[-1], "kind": "finished", "step": 40}


def test_a_workload_crash_is_one_line_and_exit_1(tmp_path: Path) -> None:
    spec = write_spec(tmp_path / "job.toml", steps=20)
    proc = run_job(spec, tmp_path / "work", env=env_with(HOTSPARE_INJECT="crash@3"))
    assert proc.returncode == exitcodes.FAILED
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr, (
        proc.stderr
    )
    assert "injected crash at step 3" in proc.stderr
    assert "Traceback" in (tmp_path / "work" / "crash.log").read_text()
    assert proc.of("fault")[-1]["fault"] == "crash"


@pytest.mark.long  # the suite refuses a Start while the executor holds the same lock, acquire(),
# and exits BUSY in one line (test_serve_twin)
def test_a_second_executor_on_the_same_workdir_is_refused(tmp_path: Path) -> None:
    spec = write_spec(tmp_path / "job.toml", steps=2000)
    first = ExecutorProcess(
        ["run", "--spec", str(spec), "--workdir", str(tmp_path / "w"), "--json"]
    )
    first.wait_event(lambda e: e["kind"] == "progress", 60, "training")
    second = run_job(spec, tmp_path / "w")
    first.proc.send_signal(signal.SIGKILL)
    first.finish()
    assert second.returncode == exitcodes.BUSY
    assert "another executor" in second.stderr
    assert len(second.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("body", "expect"),
    [
        ('name = "x"\nsteps = "ten"\n', "job.toml:2: steps: Expected `int`, got `str`"),
        (
            'name = "x"\nsteps = 10\nstepz = 3\n',
            "job.toml:3: stepz: unknown key `stepz` (did you mean `steps`?)",
        ),
        ('name = "x"\nsteps = 10\nworkload = "nope"\n', "unknown workload 'nope'"),
        (
            'name = "x"\nsteps = 10\n[config]\nn_layers = 2\n',
            "config: Object contains unknown field `n_layers`",
        ),
        (
            'name = "x"\nsteps = 10\nexecutor = "slurm"\n',
            "unknown executor kind 'slurm'; available: command, torch",
        ),
        ('name = "x"\nsteps = [10\n', "TOML syntax error"),
        (
            'name = "x"\nsteps = 10\n[config]\nglobal_batch = 6\nmicro_batch = 4\n',
            "must be positive and divide",
        ),
    ],
)
def test_bad_specs_are_one_line_and_exit_2(tmp_path: Path, body: str, expect: str) -> None:
    """Said before torch is imported (it took seconds to say a typo): a ``torch`` that fails
    to import comes first on the path, and the line is the spec's error, not its."""
    spec = tmp_path / "job.toml"
    spec.write_text(body)
    poison = tmp_path / "poison" / "torch"
    poison.mkdir(parents=True)
    (poison / "__init__.py").write_text('raise ImportError("torch was imported")\n')
    env = env_with()
    env["PYTHONPATH"] = f"{poison.parent}{os.pathsep}{env['PYTHONPATH']}"
    proc = run_job(spec, tmp_path / "w", env=env, timeout=60)
    assert proc.returncode == exitcodes.CONFIG
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert expect in lines[0]
    assert not list((tmp_path / "w").glob("checkpoints/*")), "nothing written"
