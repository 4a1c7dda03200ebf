"""A command's checkpoint is taken as soon as it is safe to, and never torn: a file a process of
the run holds open for writing waits, a closed one is published long before ``settle_s``, one
whose writer was killed mid-write is never published, and a marker layout publishes at once.

Real files written by real processes (tests/ckpt_writer.py), driven through a gate folder;
every wait is on a condition with a deadline.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support.helpers import REPO, wait_for

from executors.agent.control import Control
from executors.agent.inject import Injections
from executors.kinds import Outcome
from executors.kinds.command.command_kind import CommandKind, CommandRunner
from executors.kinds.command.command_watch import Watcher
from executors.kinds.command.command_writers import LOCAL_FS, Writers, mount_fs
from protocol.layouts import LAYOUTS
from protocol.messages import ExecutorMessage, Log
from protocol.spec import CommandSpec, JobSpec

WRITER = REPO / "tests" / "ckpt_writer.py"
HALF = 1 << 16
Start = Callable[..., subprocess.Popen[bytes]]


@pytest.fixture
def start() -> Iterator[Start]:
    """Start a process; each one still running at the end is killed by its pid."""
    procs: list[subprocess.Popen[bytes]] = []

    def run(*argv: str | Path) -> subprocess.Popen[bytes]:
        procs.append(subprocess.Popen([str(a) for a in argv]))
        return procs[-1]

    yield run
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait(10)


def steps(w: Watcher) -> list[int]:
    return [c.step for c in w.complete()]


def spec(**kw: object) -> CommandSpec:
    return CommandSpec(argv=["true"], checkpoint_glob="ckpt-*.pt", **kw)  # type: ignore[arg-type]


def gated(tmp_path: Path) -> tuple[Path, Path]:
    gate = tmp_path / "gate"
    gate.mkdir()
    return tmp_path / "ckpt", gate


def test_a_file_held_open_for_writing_waits_however_long_it_stays_unchanged(
    tmp_path: Path, start: Start
) -> None:
    folder, gate = gated(tmp_path)
    p = start(sys.executable, WRITER, "hold", folder / "ckpt-10.pt", "--gate", gate)
    said: list[str] = []
    w = Watcher(folder, spec(settle_s=0.2), warn=said.append, writers=Writers(lambda: [p.pid]))
    wait_for(lambda: (gate / "holding").exists(), 30, "the writer holding its file open")

    def refused_while_open() -> list[str]:
        assert steps(w) == [], "taken while its writer still held it open"
        return said

    wait_for(refused_while_open, 10, "the warning that it stayed unchanged but open")
    assert f"process {p.pid} of the command still holds it open for writing" in said[0]
    (gate / "release").touch()
    wait_for(lambda: (gate / "closed").exists(), 30, "the writer closing its file")
    wait_for(lambda: steps(w) == [10], 10, "the closed file taken")
    assert (folder / "ckpt-10.pt").stat().st_size == 2 * HALF


def test_a_closed_file_is_taken_at_the_first_poll_not_after_settle_s(
    tmp_path: Path, start: Start
) -> None:
    folder, gate = gated(tmp_path)
    p = start(sys.executable, WRITER, "hold", folder / "ckpt-10.pt", "--gate", gate)
    w = Watcher(folder, spec(settle_s=30), writers=Writers(lambda: [p.pid]))
    wait_for(lambda: (gate / "holding").exists(), 30, "the writer holding its file open")
    assert steps(w) == []
    (gate / "release").touch()
    wait_for(lambda: (gate / "closed").exists(), 30, "the writer closing its file")
    assert steps(w) == [10], "closed by its writer, alive, and unchanged across the scan"


def test_where_the_runs_processes_cannot_be_read_settle_s_decides(
    tmp_path: Path, start: Start
) -> None:
    folder, gate = gated(tmp_path)
    start(sys.executable, WRITER, "hold", folder / "ckpt-10.pt", "--gate", gate)
    (gate / "release").touch()
    wait_for(lambda: (gate / "closed").exists(), 30, "the writer closing its file")
    w = Watcher(folder, spec(settle_s=30), writers=Writers(lambda: None))
    assert [steps(w), steps(w), steps(w)] == [[], [], []]


def test_a_writer_killed_mid_write_leaves_a_file_never_taken_while_the_run_goes_on(
    tmp_path: Path, start: Start
) -> None:
    """torchrun's worker killed while saving, the launcher alive: the file never changes again,
    and settle_s alone would take it; its writer was seen holding it, and ended so."""
    folder, gate = gated(tmp_path)
    rest = start("sleep", "300")
    p = start(sys.executable, WRITER, "torn", folder / "ckpt-10.pt", "--gate", gate)
    said: list[str] = []
    w = Watcher(
        folder, spec(settle_s=0.2), warn=said.append, writers=Writers(lambda: [rest.pid, p.pid])
    )
    wait_for(lambda: (gate / "holding").exists(), 30, "the writer holding its file open")
    wait_for(lambda: steps(w) == [] and said, 10, "the file seen held open past settle_s")
    os.kill(p.pid, signal.SIGKILL)
    p.wait(10)
    killed = time.monotonic()
    wait_for(lambda: steps(w) == [] and any("torn" in s for s in said), 10, "the torn warning")
    assert f"process {p.pid} of the command ended while it held it open" in said[-1]
    while time.monotonic() - killed < 10 * 0.2:  # ten times settle_s, the file unchanged
        assert steps(w) == [], "a torn file taken"
        time.sleep(0.05)


def test_a_writer_killed_before_it_was_ever_seen_holding_its_file_leaves_it_untaken(
    tmp_path: Path, start: Start
) -> None:
    """No poll saw it open: the run had it at the poll before the file appeared, and it is gone."""
    folder, gate = gated(tmp_path)
    rest = start("sleep", "300")
    p = start(sys.executable, WRITER, "torn", folder / "ckpt-10.pt", "--gate", gate, "--wait-start")
    w = Watcher(folder, spec(settle_s=30), writers=Writers(lambda: [rest.pid, p.pid]))
    assert [steps(w), steps(w)] == [[], []], "no file yet; the run's processes read"
    (gate / "start").touch()
    wait_for(lambda: (gate / "holding").exists(), 30, "the writer holding its file open")
    os.kill(p.pid, signal.SIGKILL)
    p.wait(10)
    assert [steps(w), steps(w), steps(w)] == [[], [], []], "closed by a kill, not by its writer"
    assert w.writing("ckpt-10.pt") is None, "never seen open"


def test_a_marker_layout_publishes_at_once_but_not_while_its_marker_is_being_written(
    tmp_path: Path, start: Start
) -> None:
    """Hugging Face's checkpoint-N/: trainer_state.json, written last and in place."""
    folder, gate = gated(tmp_path)
    cs = CommandSpec(argv=["true"], **LAYOUTS["hf_trainer"].keys, settle_s=30)
    p = start(sys.executable, WRITER, "hf", folder / "checkpoint-5", "--gate", gate)
    w = Watcher(folder, cs, writers=Writers(lambda: [p.pid]))
    assert steps(w) == []
    wait_for(lambda: (gate / "holding").exists(), 30, "trainer_state.json held open")
    assert [steps(w), steps(w)] == [[], []], "its marker is there, newest, and still open"
    (gate / "release").touch()
    wait_for(lambda: (gate / "closed").exists(), 30, "trainer_state.json closed")
    assert steps(w) == [5], "the first poll after the marker was closed"
    assert json.loads((folder / "checkpoint-5" / "trainer_state.json").read_text())


def test_the_filesystem_type_comes_from_the_longest_mount_point(tmp_path: Path) -> None:
    info = tmp_path / "mountinfo"
    info.write_text(
        "22 1 253:1 / / rw,relatime - ext4 /dev/vda rw\n"
        "40 22 0:50 / /mnt/shared\\040data rw,relatime - nfs4 srv:/x rw\n"
        "41 22 0:51 / /mnt/sharedx rw,relatime - tmpfs tmpfs rw\n"
    )
    assert mount_fs(Path("/mnt/shared data/ckpt"), str(info)) == "nfs4"
    assert mount_fs(Path("/mnt/sharedx/ckpt"), str(info)) == "tmpfs"
    assert mount_fs(Path("/srv"), str(info)) == "ext4"
    assert "nfs4" not in LOCAL_FS and "fuse" not in LOCAL_FS


# ------------------------------------------------------------------ the runner, end to end


def run_writer(
    tmp_path: Path, mode: str, gate: Path, settle_s: float
) -> tuple[CommandRunner, threading.Thread, list[ExecutorMessage], list[Outcome]]:
    """The command kind running ckpt_writer.py (exec'd in its fence, no zygote) in a thread."""
    cs = CommandSpec(
        argv=[
            sys.executable,
            str(WRITER),
            mode,
            "{checkpoint_dir}/ckpt-10.pt",
            "--gate",
            str(gate),
        ],
        checkpoint_glob="ckpt-*.pt",
        settle_s=settle_s,
        preload=[],
    )
    spec = JobSpec(name="w", executor="command", steps=10, command=cs)
    events: list[ExecutorMessage] = []
    work = tmp_path / "w"
    runner = CommandKind().runner(
        spec, work, events.append, control=Control(epoch=1), device=None, injections=Injections()
    )
    outcome: list[Outcome] = []
    thread = threading.Thread(target=lambda: outcome.append(runner.run()), daemon=True)
    thread.start()
    return runner, thread, events, outcome


def test_a_closed_checkpoint_is_published_long_before_settle_s(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    gate.mkdir()
    runner, thread, _events, outcome = run_writer(tmp_path, "hold", gate, settle_s=30)
    published = runner.pub.folder
    try:
        wait_for(lambda: (gate / "holding").exists(), 60, "the command holding its file open")
        wait_for(lambda: runner.watcher.writing("ckpt-10.pt"), 30, "the file judged open")
        (gate / "release").touch()
        wait_for(lambda: (gate / "closed").exists(), 30, "the command closing its file")
        closed = time.monotonic()
        wait_for(lambda: list(published.glob("step-*.json")), 10, "the checkpoint published")
        took = time.monotonic() - closed
        assert took < 5, f"published {took:.1f} s after it was closed (settle_s 30)"
        manifest = json.loads((published / "step-0000000010.json").read_bytes())
        assert (manifest["step"], manifest["size"]) == (10, 2 * HALF)
        assert (published / "step-0000000010.pt").stat().st_size == 2 * HALF
    finally:
        (gate / "exit").touch()
        thread.join(60)
    assert outcome and outcome[0].reason == "finished"


def test_a_command_killed_mid_write_never_has_its_checkpoint_published(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    gate.mkdir()
    runner, thread, events, outcome = run_writer(tmp_path, "torn", gate, settle_s=0.3)
    published = runner.pub.folder
    try:
        wait_for(lambda: (gate / "holding").exists(), 60, "the command holding its file open")

        def held_past_settle() -> bool:
            assert not list(published.glob("step-*")), "published while open"
            return any(isinstance(e, Log) and "still holds it open" in e.text for e in events)

        wait_for(held_past_settle, 10, "the file judged held open past settle_s")
        os.kill(int((gate / "holding").read_text()), signal.SIGKILL)
        thread.join(60)
    finally:
        (gate / "never").touch()
        thread.join(60)
    assert outcome and outcome[0].reason == "crash"
    assert not list(published.glob("step-*")), "a torn write was published"


def test_a_writer_that_ends_while_its_files_are_read_is_not_counted_alive(
    tmp_path: Path, start: Start, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by a fresh-clone run (test_command_kind, the settle rule): a script died holding
    ckpt-30.pt half written, between the scan's "is it alive" and its read of the process's
    open files. Its files were gone, so it held nothing, and it counted alive: the torn file
    was published. Here its end is made to fall exactly there."""
    from executors.kinds.command import command_writers

    folder, gate = gated(tmp_path)
    rest = start("sleep", "300")
    p = start(sys.executable, WRITER, "torn", folder / "ckpt-10.pt", "--gate", gate, "--wait-start")
    w = Watcher(folder, spec(settle_s=30), writers=Writers(lambda: [rest.pid, p.pid]))
    assert [steps(w), steps(w)] == [[], []], "no file yet; the run's processes read"
    (gate / "start").touch()
    wait_for(lambda: (gate / "holding").exists(), 30, "the writer holding its file open")
    assert steps(w) == [], "held open: not taken"
    real = command_writers._holding

    def ended_first(pid: int, wanted: set, deadline: float) -> set | None:  # type: ignore[type-arg]
        if pid == p.pid:  # SIGKILL, and wait until its end has closed its files
            p.kill()
            wait_for(lambda: not os.listdir(f"/proc/{pid}/fd"), 10, "its files closed by its end")
        return real(pid, wanted, deadline)

    monkeypatch.setattr(command_writers, "_holding", ended_first)
    assert steps(w) == [], "its writer ended mid-write: torn, not closed"
    monkeypatch.setattr(command_writers, "_holding", real)
    assert steps(w) == [], "and never taken after"
