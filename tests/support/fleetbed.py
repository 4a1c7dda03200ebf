"""A fleet on this machine for controller tests: an inventory of hosts, a job, its baseline sha."""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import psutil
import tomli_w

from support.helpers import REPO, TINY_CONFIG, env_with
from support.once import once
from support.wait import until as until  # re-exported: the tests import it from here too

# Fast detection for tests: heartbeat 0.25 s, suspect after 1 s, lease 3 s.
FAST_CONSOLE = {
    "heartbeat_s": 0.25,
    "suspect_after_s": 1.0,
    "missed_heartbeats": 3,
    "lease_s": 3.0,
    "clock_skew_s": 0.2,
    "unattended_s": 0.0,  # a console that quits leaves leases as they are (tests set it)
    "connect_timeout_s": 5.0,
    "command_timeout_s": 30.0,
}
FULL_SPEED_ENV = {"OMP_NUM_THREADS": "1"}
"""One thread, full speed: an uninterrupted reference run's environment, and the chaos fleet's
(its faults come every so many steps: pacing would only make it longer)."""
PACE_S = float(os.environ.get("HOTSPARE_TEST_PACE_S", "0.012"))
EXECUTOR_ENV = {**FULL_SPEED_ENV, **({"HOTSPARE_INJECT": f"slow_step@{PACE_S}"} if PACE_S else {})}
"""A test executor's: paced to about a fifth of a core (a step is ~3 ms of CPU here, then it
sleeps 12 ms; about 65 steps a second). A test mostly waits on time (a lease, a failover, a
probe) while its job trains: unpaced, that training took a whole core from the test beside it.
Paced at 5 ms (a third of a core) the suite took 1530 CPU s and 863 s; at 12 ms, 1375 CPU s
and 822 s, every test passing (fresh clones of ccb9fd2 and 8f28854). What a step computes is the
same, so every run still ends with its reference's parameters. A test that sets its own
``HOTSPARE_INJECT`` runs unpaced, and ``HOTSPARE_TEST_PACE_S=0`` runs the whole suite unpaced
(checkpoints every few tens of milliseconds: races a paced run makes rarer)."""
POLL_S = 0.05


STEPS = 400
"""A test job's length: about 2.5 CPU s of training here (800 cost 20% more CPU per test)."""


WARM_STANDBY = os.environ.get("HOTSPARE_TEST_WARM_STANDBY") == "1"
"""A test job keeps no warm standby unless it asks (``warm_standby=None``: the product's
default, on for a job on one host; ``True``). A standby is one more torch executor started per
job, about 2.5 CPU s (importing torch, then ``torch._dynamo`` at the optimizer's first
``add_param_group``), and about 60 of them were readied in the suite by tests not about them,
40 never used. The standby's own paths are proven where they are named (test_standby,
test_warm_standby_default, test_spare_health, test_controller_local's takeover, the chaos
seed's fleet); ``HOTSPARE_TEST_WARM_STANDBY=1`` gives every test job the product's default."""


def _with(job: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``job`` with ``over`` on top, and no warm standby unless asked (WARM_STANDBY);
    ``warm_standby=None`` removes the key: the product's default."""
    if not WARM_STANDBY:
        job["warm_standby"] = False
    job.update(over)
    if job.get("warm_standby", 0) is None:
        del job["warm_standby"]
    return job


def job_table(**over: Any) -> dict[str, Any]:
    """A test job's table; ``warm_standby=None`` leaves the product's default (WARM_STANDBY)."""
    job: dict[str, Any] = {
        "steps": STEPS,
        "seed": 11,
        "checkpoint_every_steps": 20,
        "keep_checkpoints": 3,
        "config": dict(TINY_CONFIG),
    }
    return _with(job, over)


STDLIB_SCRIPT = REPO / "tests" / "train_stdlib.py"


def stdlib_job(**over: Any) -> dict[str, Any]:
    """A job for a test whose subject is the console (its views, reports, spares, leases, a
    drain), not what trains: the command kind running STDLIB_SCRIPT, which imports no torch.
    A torch job's executor costs about 2 CPU s importing torch and ``torch._dynamo`` and its
    400 steps about 2.5 more; this one, about 0.1 s in all, paced to the torch job's step
    time so a test's timing is the same. It checkpoints, resumes bit-exact (``baseline_sha``
    works as for a torch job) and stops at SIGTERM with a checkpoint, as a real script does.
    Keys as ``job_table``'s: ``steps``, ``seed``, ``checkpoint_every_steps`` (the script's
    ``--save-every``), ``warm_standby``; any other key goes into the job's table."""
    every = over.pop("checkpoint_every_steps", 20)
    argv = [sys.executable, str(STDLIB_SCRIPT), "--checkpoint-dir", "{checkpoint_dir}"]
    argv += ["--resume", "{resume_from}", "--steps", "{steps}", "--seed", "{seed}"]
    argv += ["--save-every", str(every), "--step-s", f"{PACE_S + 0.003:g}"]
    job: dict[str, Any] = {
        "executor": "command",
        "steps": STEPS,
        "seed": 11,
        "keep_checkpoints": 3,
        "command": {
            "argv": argv,
            "preload": [],  # the default preloads torch in a zygote: this script needs none
            "checkpoint_glob": "ckpt-*.json",
            "complete_marker": "{name}.done",
            "progress_regex": r"step (?P<step>\d+) loss (?P<loss>[0-9.]+)",
            "params_regex": r"^params sha256 (?P<sha256>[0-9a-f]{64})$",
        },
    }
    return _with(job, over)


def write_inventory(
    path: Path,
    hosts: dict[str, dict[str, Any]],
    jobs: dict[str, dict[str, Any]],
    regions: tuple[str, ...] = ("r1", "r2"),
    **console: Any,
) -> Path:
    data = {
        "console": {**FAST_CONSOLE, "state_dir": str(path.parent / "state"), **console},
        "regions": {r: {"priority": i + 1} for i, r in enumerate(regions)},
        "hosts": hosts,
        "jobs": jobs,
    }
    path.write_text(tomli_w.dumps(data))
    return path


def set_console(inventory: Path, **console: Any) -> Path:
    """Change settings of an inventory's ``[console]`` table in place (a longer lease)."""
    data = tomllib.loads(inventory.read_text())
    data["console"].update(console)
    inventory.write_text(tomli_w.dumps(data))
    return inventory


def add_provisioner(
    inventory: Path, command: list[str], release: list[str] | None = None, **settings: Any
) -> None:
    """Append a ``[provisioner]`` table (TOML-quoted by tomli_w) to a written inventory."""
    table: dict[str, Any] = {"command": command, **settings}
    if release is not None:
        table["release"] = release
    with inventory.open("a", encoding="utf-8") as f:
        f.write("\n" + tomli_w.dumps({"provisioner": table}))


def local_host(root: Path, region: str = "r1", **over: Any) -> dict[str, Any]:
    return {"region": region, "transport": "local", "root": str(root), **over}


def _baseline(inventory: Path, job: str, workdir: Path) -> tuple[str, str]:
    """(``params_sha256``, ``checkpoint_params``) of the job run uninterrupted, made once per
    spec and test run, whichever worker asks first (``once``)."""
    from console.inventory import load

    spec = load(inventory).jobs[job].spec

    def make() -> list[str]:
        sha = _run_baseline(inventory, job, workdir)
        return [sha, checkpoint_params(workdir) if spec.executor == "torch" else ""]

    sha, params = once(b"fleetbed.baseline " + msgspec.json.encode(spec), make)
    return sha, params


def baseline_sha(inventory: Path, job: str, workdir: Path) -> str:
    """The job run uninterrupted by the executor alone, with the same environment (once per
    spec; ``workdir``: where it runs, if this is the first ask)."""
    return _baseline(inventory, job, workdir)[0]


def baseline_params(inventory: Path, job: str, workdir: Path) -> str:
    """``checkpoint_params`` of the uninterrupted run's final checkpoint (run once per spec)."""
    return _baseline(inventory, job, workdir)[1]


def checkpoint_params(workdir: Path) -> str:
    """sha256 over the model tensors of the newest checkpoint in a torch-kind workdir, loaded
    here with ``weights_only`` and hashed here: evidence the executor's own digest is not."""
    import hashlib

    import torch

    newest = max((workdir / "checkpoints").glob("step-*.pt"))
    state = torch.load(newest, weights_only=True)
    h = hashlib.sha256()
    for name, t in sorted(state["workload"]["model"].items()):
        h.update(name.encode())
        h.update(t.contiguous().numpy().tobytes())
    return h.hexdigest()


def _run_baseline(inventory: Path, job: str, workdir: Path) -> str:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "executors.cli",
            "run",
            "--spec",
            str(inventory),
            "--job",
            job,
            "--workdir",
            str(workdir),
            "--json",
        ],
        capture_output=True,
        text=True,
        env=env_with(**FULL_SPEED_ENV),
        cwd=REPO,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])["params_sha256"]


def slow_python(
    folder: Path, delay_s: float = 0.8, *, serve_only: bool = False
) -> tuple[Path, Path]:
    """A host's ``python`` that starts ``delay_s`` late while its flag file exists (a loaded
    host slow to start a program): the wrapper's path (an inventory's ``python``) and the flag.
    ``serve_only``: only an executor's ``serve`` is late (torch imported from a slow disk), the
    console's probes of the host are not."""
    import shlex
    import sys

    folder.mkdir(parents=True, exist_ok=True)
    flag, wrapper = folder / "slow.flag", folder / "slow-python"
    late = f"[ -e {shlex.quote(str(flag))} ] && sleep {delay_s}"
    if serve_only:
        late = f'case "$*" in *"executors.cli serve "*) {late};; esac'
    wrapper.write_text(f'#!/bin/sh\n{late}\nexec {shlex.quote(sys.executable)} "$@"\n')
    wrapper.chmod(0o755)
    return wrapper, flag


async def quit_mid(
    ctl: Any, run: asyncio.Task[Any], pending: asyncio.Task[Any] | None, journal: Path
) -> None:
    """The console quits (its ``run`` cancelled, then closed) while ``pending``, a task of a
    job's supervision, is under way: that task ends with the supervision, and nothing is
    written after the console's own 'console stopped' (a task left running once wrote into the
    closed journal: 'I/O operation on closed file')."""
    assert not run.done(), run
    assert pending is not None and not pending.done(), "under way when the console quits"
    run.cancel()
    await asyncio.gather(run, return_exceptions=True)
    await ctl.close()
    assert pending.done() and pending.cancelled(), "it ended with the supervision"
    from console.records.journal import read

    events = list(read(journal))
    assert events[-1].msg == "console stopped", events[-1]


async def run_until(
    ctl: Any, predicate: Callable[[], Any], timeout: float, what: str
) -> asyncio.Task[Any]:
    """Start the controller's run and wait until ``predicate`` holds, the run still going."""
    task = asyncio.create_task(ctl.run())
    await until(lambda: predicate() or task.done(), timeout, what)
    assert not task.done(), (
        f"the run ended before {what}: {task.result() if not task.exception() else task.exception()}"
    )
    return task


async def cancelled(task: asyncio.Task[Any], timeout: float = 60.0) -> None:
    """Cancel a console's run and wait for it to end, within a deadline. Past it, the stacks of
    every task still running are the failure's message: a console that does not quit is a bug
    to find, not a wait for the test's timeout to end."""
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=timeout)
    if done:
        return
    stacks = io.StringIO()
    for t in asyncio.all_tasks():
        if t is not asyncio.current_task():
            t.print_stack(file=stacks)
    raise AssertionError(f"the run did not end {timeout} s after its cancel:\n{stacks.getvalue()}")


def executor_proc(workdir: Path) -> psutil.Process:
    """The executor that runs in ``workdir`` now (its pid file)."""
    return psutil.Process(int((workdir / "executor.pid").read_text()))


def executor_tree(workdir: Path) -> list[psutil.Process]:
    """The executor that runs in ``workdir`` now and every process under it."""
    top = executor_proc(workdir)
    return [top, *top.children(recursive=True)]


def gone(p: psutil.Process) -> bool:
    """Ended: no longer running, or a zombie its parent has not reaped yet."""
    try:
        return not p.is_running() or p.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def mtimes(folder: Path) -> dict[Path, int]:
    """Every file under ``folder`` and its modification time (what must not change again)."""
    return {p: p.stat().st_mtime_ns for p in folder.rglob("*") if p.is_file()}


async def cut_until_fenced(
    cut: Callable[[], None], workdir: Path, timeout: float = 60.0
) -> dict[Path, int]:
    """Cut a host off (``cut``) and wait until the executor that ran in ``workdir`` has ended by
    itself (its lease ran out); the files there then, with their times (``mtimes``)."""
    old = executor_proc(workdir)
    cut()
    await until(lambda: gone(old), timeout, f"the executor in {workdir} to stop (its lease ends)")
    return mtimes(workdir)


def caught_up(ctl: Any, interval: int, job: str = "j", spare: str = "b") -> bool:
    """The spare's replica is within one checkpoint interval of the job's newest checkpoint:
    the premise of a bound of "one interval, plus a checkpoint on its way" on a failover's lost
    steps (on a loaded machine the first replica can land many intervals late)."""
    replica, newest = ctl.replicator.replica(job, spare).manifest, ctl.jobs[job].checkpoint
    return replica is not None and newest is not None and replica.step >= newest.step - interval


def newest_checkpoint(workdir: Path) -> int:
    """The newest checkpoint published in ``workdir`` (its file on disk; 0 if none)."""
    steps = [int(p.stem.removeprefix("step-")) for p in (workdir / "checkpoints").glob("step-*.pt")]
    return max(steps, default=0)


async def kill_caught_up(
    ctl: Any,
    processes: Callable[[], list[psutil.Process]],
    kill: Callable[[], None],
    workdir: Path,
    interval: int,
    job: str = "j",
    spare: str = "b",
    timeout: float = 120.0,
) -> tuple[int, float]:
    """Kill a job's host at a moment its spare has kept up, judged from evidence at that moment:
    the host's ``processes`` stopped (SIGSTOP) so no step or checkpoint lands meanwhile, then the
    newest checkpoint on its disk (``workdir``) set against the replica the console verified on
    the spare. Within one ``interval``: ``kill`` (SIGKILL stops nothing stopped from dying).
    Otherwise the host goes on (SIGCONT) and it is tried again. Returns the replica's step and
    the time (``time.time()``) of the kill.

    On a loaded machine a kill is not instant (finding every process of a host takes a while),
    and a 20-step interval here is 70 ms of training: a bound of "one interval, plus one in
    flight" on the steps a failover loses holds only when measured from the moment of the kill."""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        await until(lambda: caught_up(ctl, interval, job, spare), left, f"{spare} to keep up")
        frozen = await asyncio.to_thread(processes)
        stopped = [p for p in frozen if _signal(p, signal.SIGSTOP)]
        replica = ctl.replicator.replica(job, spare).manifest
        if replica is not None and replica.step >= newest_checkpoint(workdir) - interval:
            at = time.time()
            kill()
            return int(replica.step), at
        for p in stopped:
            _signal(p, signal.SIGCONT)


def _signal(p: psutil.Process, sig: int) -> bool:
    try:
        p.send_signal(sig)
    except psutil.Error:
        return False
    return True
