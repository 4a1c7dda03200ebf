"""The real ``hotspare`` command in a real terminal (tmux), driven by keys as a person would."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.fleetbed import POLL_S, local_host, stdlib_job, write_inventory
from support.tmuxbed import (
    HOTSPARE,
    lock_holder,
    paced_env,
    stop_controller,
    tmux,
    until_shown,
    view_command,
)
from support.uibed import fleet, reap

from console.records.incidents import incidents
from console.records.journal import Kind, read

pytestmark = pytest.mark.usefixtures("reap_executors")  # conftest: its processes killed after
SESSION = f"hotspare-test-{os.getpid()}"  # apart from a test run beside this one


def screen() -> str:
    return tmux("capture-pane", "-p", "-t", SESSION)


def pane_history() -> str:
    """The pane with its history (what scrolled off), wrapped lines joined (120 columns wrap)."""
    return "".join(tmux("capture-pane", "-p", "-J", "-S", "-100", "-t", SESSION).splitlines())


def quit_note_shown(_: str) -> bool:
    """The note printed after the view exits (it may have scrolled off the screen)."""
    return "keeps every job training" in pane_history()


@pytest.fixture
def session() -> Iterator[None]:
    assert shutil.which("tmux"), "tmux is needed (scripts/test installs it)"
    subprocess.run(["tmux", "kill-session", "-t", SESSION], capture_output=True, timeout=10)
    yield
    subprocess.run(["tmux", "kill-session", "-t", SESSION], capture_output=True, timeout=10)


@pytest.mark.long  # the suite drives the real command in tmux by keys, quit and the controller kept (below), and quits with Ctrl-C (test_app)
def test_the_real_command_in_tmux_shows_the_fleet_and_answers_keys(
    tmp_path: Path, session: None
) -> None:
    inventory = fleet(tmp_path, steps=200_000)
    command = view_command(inventory, "--policy", "auto")
    tmux("new-session", "-d", "-s", SESSION, "-x", "120", "-y", "40", command)
    tmux("set-option", "-t", SESSION, "remain-on-exit", "on")
    shown = until_shown(SESSION, lambda s: "Fleet" in s and "r2" in s, 30, "the Fleet view")
    assert "policy auto" in shown
    until_shown(
        SESSION,
        lambda s: any(line.split()[:1] == ["a"] and "j" in line.split() for line in s.splitlines()),
        60,
        "job j on host a",
    )
    tmux("send-keys", "-t", SESSION, "2")
    until_shown(SESSION, lambda s: "Jobs" in s and "running" in s, 60, "j running in the Jobs view")
    tmux("send-keys", "-t", SESSION, "?")
    until_shown(SESSION, lambda s: "checkpoint now" in s and "Esc or ? closes" in s, 10, "the keys")
    tmux("send-keys", "-t", SESSION, "Escape")
    until_shown(SESSION, lambda s: "Esc or ? closes" not in s, 10, "help closed")
    controller = lock_holder(inventory.parent / "state")
    assert controller is not None and f"controller pid {controller}" in screen()
    tmux("send-keys", "-t", SESSION, "C-c")  # Ctrl-C quits, as in k9s and htop (q below)
    until_shown(SESSION, quit_note_shown, 30, "the quit note")
    assert "Traceback" not in pane_history()
    # the view is gone; the controller it started is not (it holds the state dir still)
    assert lock_holder(inventory.parent / "state") == controller
    assert f"controller pid {controller} stopped" in stop_controller(inventory)
    stopped = list(read(inventory.parent / "state" / "journal.jsonl"))[-1]
    assert stopped.kind is Kind.CONSOLE and stopped.msg == "console stopped", "closed by stop"


def test_kill_lease_wait_failover_revive_incident_quit_and_a_quiet_second_start(
    tmp_path: Path, session: None
) -> None:
    """As a person would: k on the job's host, the lease counted down in the Jobs view, the
    failover, r, Enter on the incident, q; then a second start reattaches with no incident."""
    inventory = write_inventory(
        tmp_path / "inventory.toml",
        hosts={
            "a": local_host(tmp_path / "a"),
            "b": local_host(tmp_path / "b", role="spare"),
            "c": local_host(tmp_path / "c", region="r2", role="spare"),
        },
        jobs={"j": {"host": "a", "spares": ["b"], **stdlib_job(steps=200_000)}},
        lease_s=8.0,
        unattended_s=120.0,
    )
    command = view_command(inventory, "--policy", "auto")
    tmux("new-session", "-d", "-s", SESSION, "-x", "120", "-y", "40", command)
    tmux("set-option", "-t", SESSION, "remain-on-exit", "on")
    journal = inventory.parent / "state" / "journal.jsonl"

    def replica_on_b() -> bool:
        return any(e.kind is Kind.REPLICA and e.host == "b" for e in read(journal))

    until_shown(SESSION, lambda s: "Fleet" in s and "r2" in s, 30, "the Fleet view")
    until_shown(SESSION, lambda s: replica_on_b(), 90, "a replica on b")
    tmux("send-keys", "-t", SESSION, "-l", ":")
    # typed before the palette is open, the keys would reach the screen under it (CI: lost)
    until_shown(SESSION, lambda s: "Search for commands" in s, 10, "the palette open")
    tmux("send-keys", "-t", SESSION, "-l", "kill a")
    until_shown(SESSION, lambda s: "SIGKILL its executors" in s, 10, "the palette's hit")
    tmux("send-keys", "-t", SESSION, "Enter")
    until_shown(SESSION, lambda s: "kill local host a?" in s.lower(), 10, "the confirm")
    tmux("send-keys", "-t", SESSION, "y")
    tmux("send-keys", "-t", SESSION, "2")
    until_shown(
        SESSION, lambda s: "waiting out lease on a" in s, 20, "the lease wait in the Jobs view"
    )
    until_shown(SESSION, lambda s: "b -> " in s and "running" in s, 60, "j running on b")
    tmux("send-keys", "-t", SESSION, "1")
    until_shown(SESSION, lambda s: "down" in s, 10, "a down in the Fleet view")
    tmux("send-keys", "-t", SESSION, "r")
    until_shown(SESSION, lambda s: "revive" in s.lower() or "up" in s, 10, "a revived")
    tmux("send-keys", "-t", SESSION, "3")
    until_shown(SESSION, lambda s: "host_lost" in s, 10, "the incident listed")
    tmux("send-keys", "-t", SESSION, "Enter")
    until_shown(SESSION, lambda s: "MTTR" in s and "first_step" in s, 10, "the incident's report")
    tmux("send-keys", "-t", SESSION, "Escape")
    until_shown(SESSION, lambda s: "MTTR:" not in s, 10, "back to the incidents")
    tmux("send-keys", "-t", SESSION, "q")
    until_shown(SESSION, quit_note_shown, 30, "the quit note")
    before = len(incidents(read(journal)))
    state = inventory.parent / "state"
    controller = lock_holder(state)

    # a second view attaches to the same controller: nothing restarts, nothing is reattached
    tmux("respawn-pane", "-k", "-t", SESSION, command)
    tmux("clear-history", "-t", SESSION)  # the first quit note must not answer for the second
    until_shown(
        SESSION, lambda s: f"controller pid {controller}" in s, 30, "the second view attached"
    )
    tmux("send-keys", "-t", SESSION, "q")
    until_shown(SESSION, quit_note_shown, 30, "the second quit note")
    assert lock_holder(state) == controller

    # stopped, then started again: the new controller reattaches to the executor, no incident
    stop_controller(inventory)
    restarted = time.time()
    tmux("respawn-pane", "-k", "-t", SESSION, command)
    tmux("clear-history", "-t", SESSION)
    until_shown(SESSION, lambda s: "Fleet" in s and "r2" in s, 30, "the Fleet view again")
    until_shown(
        SESSION,
        lambda s: any(
            e.kind is Kind.EXECUTOR and "reattached to executor" in e.msg and e.t > restarted
            for e in read(journal)
        ),
        30,
        "the new controller reattached",
    )
    assert lock_holder(state) not in (None, controller)
    tmux("send-keys", "-t", SESSION, "q")
    until_shown(SESSION, quit_note_shown, 30, "the third quit note")
    stop_controller(inventory)
    assert len(incidents(read(journal))) == before, "no incident for a controller stopped cleanly"


def job_step(shown: str) -> int | None:
    """The step on the Jobs view's row for job j (its progress column: STEP/STEPS)."""
    for line in shown.splitlines():
        words = line.split()
        if words[:1] == ["j"] and "running" in words:
            for w in words:
                done, _, total = w.partition("/")
                if done.isdigit() and total.isdigit():
                    return int(done)
    return None


def test_a_read_only_console_beside_a_live_one_watches_and_changes_nothing(
    tmp_path: Path, session: None
) -> None:
    """`hotspare run` supervises; `hotspare --read-only` on the same state dir opens beside it,
    shows the job training, and refuses an action: the executor is untouched, the lock stays
    with the first console, and the journal has nothing the second did."""
    inventory = fleet(tmp_path, steps=200_000)
    state = tmp_path / "state"
    owner = subprocess.Popen(
        [str(HOTSPARE), "--inventory", str(inventory), "run", "--policy", "auto"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=paced_env(),
        start_new_session=True,
    )
    try:
        pidfile = tmp_path / "a" / "jobs" / "j" / "executor.pid"
        deadline = time.monotonic() + 60
        while not (pidfile.exists() and (state / "console.lock").exists()):
            assert time.monotonic() < deadline, "the first console never started j on a"
            assert owner.poll() is None, owner.stderr.read() if owner.stderr else ""
            time.sleep(POLL_S)  # polling, bounded by the deadline above
        executor = int(pidfile.read_text().strip())
        assert lock_holder(state) == owner.pid
        command = view_command(inventory, "--read-only")
        tmux("new-session", "-d", "-s", SESSION, "-x", "120", "-y", "40", command)
        tmux("set-option", "-t", SESSION, "remain-on-exit", "on")
        until_shown(
            SESSION, lambda s: "READ-ONLY" in s and "Fleet" in s, 30, "the read-only Fleet view"
        )
        tmux("send-keys", "-t", SESSION, "2")
        first = job_step(
            until_shown(SESSION, lambda s: job_step(s) is not None, 60, "j running, with its step")
        )
        assert first is not None
        until_shown(
            SESSION,
            lambda s: (job_step(s) or 0) > first,
            30,
            "j's step moving on the read-only view",
        )
        # the spare's replica as it lies on b (the owner's copy: this console copies nothing)
        until_shown(SESSION, lambda s: "b @" in s, 30, "b's replica shown")
        tmux("send-keys", "-t", SESSION, "-l", ":")
        until_shown(SESSION, lambda s: "Search for commands" in s, 10, "the palette open")
        tmux("send-keys", "-t", SESSION, "-l", "kill a")
        until_shown(SESSION, lambda s: "SIGKILL its executors" in s, 10, "the palette's hit")
        tmux("send-keys", "-t", SESSION, "Enter")
        until_shown(
            SESSION, lambda s: "read-only console" in s and "is off" in s, 10, "the refusal"
        )
        tmux("send-keys", "-t", SESSION, "q")
        until_shown(
            SESSION,
            lambda s: "Fleet" not in s or "Pane is dead" in s,
            30,
            "the read-only console gone",
        )
        assert "Traceback" not in pane_history()
        # independent evidence: the executor is the same live process; the lock is the owner's
        assert Path(f"/proc/{executor}").exists()
        assert int(pidfile.read_text().strip()) == executor
        assert owner.poll() is None and lock_holder(state) == owner.pid
        events = list(read(state / "journal.jsonl"))
        assert not [e for e in events if "kill demo host" in e.msg]
        started = [e for e in events if e.kind is Kind.EXECUTOR and "started on a" in e.msg]
        assert len(started) == 1, [e.msg for e in started]  # b's warm standby aside
    finally:
        owner.kill()
        owner.wait(timeout=30)
        with contextlib.suppress(OSError, ValueError):
            os.kill(
                int((tmp_path / "a" / "jobs" / "j" / "executor.pid").read_text()), signal.SIGKILL
            )


def test_a_tests_reap_spares_the_tmux_server_every_test_shares(tmp_path: Path) -> None:
    """CI regression: the tmux server keeps the argv of the client that started it, so a
    test reaping processes named with its folder killed every other test's sessions."""
    socket = f"hotspare-reap-{os.getpid()}"  # a server of its own: the shared one may exist

    def tm(*args: str) -> str:
        return subprocess.run(
            ["tmux", "-L", socket, *args], capture_output=True, text=True, timeout=10, check=True
        ).stdout

    try:
        tm("new-session", "-d", "-s", "mine", f"sleep 600; echo {tmp_path}")
        tm("new-session", "-d", "-s", "other", "sleep 600")
        server = int(tm("display-message", "-p", "-t", "other", "#{pid}").strip())
        assert str(tmp_path) in Path(f"/proc/{server}/cmdline").read_text()
        child = int(tm("display-message", "-p", "-t", "mine", "#{pane_pid}").strip())
        reap(tmp_path)
        tm("has-session", "-t", "other")  # raises when the server is gone
        deadline = time.monotonic() + 10
        while child in live_pids():
            assert time.monotonic() < deadline, "the test's own process was not reaped"
            time.sleep(POLL_S)  # polling, bounded by the deadline above
    finally:
        subprocess.run(["tmux", "-L", socket, "kill-server"], capture_output=True, timeout=10)


def live_pids() -> set[int]:
    """Processes that exist and are not zombies."""
    pids = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            if stat.read_text().rsplit(")", 1)[1].split()[0] != "Z":
                pids.add(int(stat.parent.name))
    return pids
