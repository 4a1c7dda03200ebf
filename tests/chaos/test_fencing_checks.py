"""The fencing checks themselves can fail: each is shown a split brain it must report (real
processes for /proc, real files for the disks) and the same scene without one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.wait import wait_for

from chaos import fencing
from chaos.disk import DiskWatch
from chaos.observe import unshift
from chaos.procs import Sampler, Trainer, Window
from console.records.journal import Event, Kind

TRAINER = """
import sys, threading, time
from executors.threadname import name_os_thread
def train():
    name_os_thread("hotspare-train")
    while True:
        sum(i * i for i in range(10000))
        if sys.argv[1] == "idle":
            time.sleep(3600)
threading.Thread(target=train, daemon=True).start()
time.sleep(3600)
"""


def _fake_executor(workdir: Path, mode: str = "train") -> subprocess.Popen[bytes]:
    """A process /proc shows as an executor of ``workdir`` whose training thread burns CPU."""
    return subprocess.Popen(
        [sys.executable, "-c", TRAINER, mode, "serve", "--workdir", str(workdir)],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])},
    )


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs /proc")
def test_the_sampler_reports_two_trainers_and_not_a_stopped_one(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    sampler = Sampler({"j": [a, b]}).start()
    procs = [_fake_executor(a), _fake_executor(b)]
    try:
        wait_for(lambda: len(sampler.overlaps) >= 3, 30, "two trainers seen at once")
        procs[1].send_signal(19)  # SIGSTOP: its thread stays, and trains no more
        stopped = time.time()
        wait_for(lambda: len(sampler.frozen) >= 3, 30, "the stopped one seen frozen")
        assert not [o for o in sampler.overlaps if o.t0 > stopped + 0.2]
    finally:
        sampler.stop()
        for p in procs:
            p.kill()
            p.wait()
    lines, n = fencing.two_trainers(sampler)
    assert n >= 1 and "2 executors trained at once" in lines[0]


def test_a_process_training_after_a_newer_epoch_started_is_reported() -> None:
    sampler = Sampler({"j": []})
    sampler.trainers = {
        10: Trainer(10, "j", "/a", [Window(0.0, 0.1), Window(5.0, 5.1), Window(20.0, 20.1)]),
        11: Trainer(11, "j", "/b", [Window(10.2, 10.3), Window(20.0, 20.1)]),
    }

    def start(t: float, epoch: int, host: str) -> Event:
        data = {"to": "running", "epoch": epoch}
        return Event(t=t, kind=Kind.JOB_STATE, job="j", host=host, data=data)

    bad = fencing.journal_epochs([start(0.0, 1, "a"), start(10.0, 2, "b")], sampler, "j")
    assert len(bad) == 1 and "pid 10" in bad[0] and "20.000" in bad[0]
    sampler.trainers[10].windows.pop()
    assert fencing.journal_epochs([start(0.0, 1, "a"), start(10.0, 2, "b")], sampler, "j") == []


def _manifest(folder: Path, step: int, epoch: int, mtime: float) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"step-{step:010d}.json"
    path.write_text(json.dumps({"job": "j", "step": step, "epoch": epoch, "sha256": f"s{step}"}))
    os.utime(path, (mtime, mtime))
    return path


def test_a_checkpoint_published_after_a_later_epoch_started_is_stale(tmp_path: Path) -> None:
    now = time.time()
    a, b = tmp_path / "a", tmp_path / "b"
    _manifest(a / "jobs/j/checkpoints", 200, 1, now - 30)
    _manifest(b / "replicas/j", 200, 1, now - 29)
    (b / "jobs/j/checkpoints").mkdir(parents=True)
    os.link(b / "replicas/j/step-0000000200.json", b / "jobs/j/checkpoints/step-0000000200.json")
    _manifest(b / "jobs/j/checkpoints", 400, 2, now - 20)  # epoch 2 publishes first at -20
    _manifest(a / "jobs/j/checkpoints", 600, 1, now - 10)  # epoch 1 publishes after: stale
    disk = DiskWatch({"a": a, "b": b}, ["j"])
    disk.scan()
    ends = fencing.lease_ends(fencing.epoch_starts([], disk, "j"))
    assert ends[1] == pytest.approx(now - 20, abs=0.01)
    lines, n = fencing.stale_files(disk, ends, "j")
    assert n == 1 and "step 600 of epoch 1" in lines[0], lines
    assert fencing.replica_origins(disk, "j") == []
    assert fencing.epoch_hosts(disk, "j") == [], "a promoted replica is not a write on b"
    # the journal bound alone is enough: epoch 2's Start at -25
    start = Event(
        t=now - 25, kind=Kind.JOB_STATE, job="j", host="b", data={"to": "running", "epoch": 2}
    )
    ends = fencing.lease_ends(fencing.epoch_starts([start], disk, "j"))
    assert ends[1] == pytest.approx(now - 25, abs=0.01)


def test_journal_times_stamped_on_a_stepped_clock_are_put_back() -> None:
    now = 1_000_000.0
    events = [
        Event(t=now - 5, kind=Kind.CONSOLE),
        Event(t=now - 4 + 3600, kind=Kind.PROGRESS),
        Event(t=now - 3 - 7200, kind=Kind.INCIDENT, data={"fault_at": now - 3.5 - 7200}),
    ]
    got = unshift(events, [3600.0, -7200.0], now=now)
    assert [e.t for e in got] == [now - 5, now - 4, now - 3]
    assert got[2].data["fault_at"] == now - 3.5
