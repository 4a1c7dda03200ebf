"""The real ``hotspare`` command in a real terminal (tmux), driven by keys as a person would."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fleetbed import POLL_S, job_table, local_host, write_inventory
from test_app import fleet, reap_executors  # noqa: F401

from console.records.incidents import incidents
from console.records.journal import Kind, read

HOTSPARE = Path(sys.executable).with_name("hotspare")
SESSION = "hotspare-test"


def tmux(*args: str) -> str:
    return subprocess.run(
        ["tmux", *args], capture_output=True, text=True, timeout=10, check=True
    ).stdout


def screen() -> str:
    return tmux("capture-pane", "-p", "-t", SESSION)


def pane_history() -> str:
    """The pane with its history (what scrolled off), wrapped lines joined (120 columns wrap)."""
    return "".join(tmux("capture-pane", "-p", "-J", "-S", "-100", "-t", SESSION).splitlines())


def quit_note_shown(_: str) -> bool:
    """The note printed after the app exits (it may have scrolled off the screen)."""
    return "executors keep training" in pane_history()


def until(predicate: Callable[[str], bool], timeout: float, what: str) -> str:
    deadline = time.monotonic() + timeout
    while True:
        shown = screen()
        if predicate(shown):
            return shown
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}; screen:\n{shown}")
        time.sleep(POLL_S)  # polling, bounded by the deadline above


@pytest.fixture
def session() -> Iterator[None]:
    assert shutil.which("tmux"), "tmux is needed (scripts/test installs it)"
    subprocess.run(["tmux", "kill-session", "-t", SESSION], capture_output=True, timeout=10)
    yield
    subprocess.run(["tmux", "kill-session", "-t", SESSION], capture_output=True, timeout=10)


def test_the_real_command_in_tmux_shows_the_fleet_and_answers_keys(
    tmp_path: Path, session: None
) -> None:
    inventory = fleet(tmp_path, steps=200_000)
    # COLUMNS/LINES from the environment would override the terminal's real size
    command = f"env -u COLUMNS -u LINES OMP_NUM_THREADS=1 {HOTSPARE} --inventory {inventory} --policy auto"
    tmux("new-session", "-d", "-s", SESSION, "-x", "120", "-y", "40", command)
    tmux("set-option", "-t", SESSION, "remain-on-exit", "on")
    shown = until(lambda s: "Fleet" in s and "r2" in s, 30, "the Fleet view")
    assert "policy auto" in shown
    until(
        lambda s: any(line.split()[:1] == ["a"] and "j" in line.split() for line in s.splitlines()),
        60,
        "job j on host a",
    )
    tmux("send-keys", "-t", SESSION, "2")
    until(lambda s: "Jobs" in s and "running" in s, 60, "j running in the Jobs view")
    tmux("send-keys", "-t", SESSION, "?")
    until(lambda s: "checkpoint now" in s and "Esc or ? closes" in s, 10, "the keys")
    tmux("send-keys", "-t", SESSION, "Escape")
    until(lambda s: "Esc or ? closes" not in s, 10, "help closed")
    tmux("send-keys", "-t", SESSION, "q")
    until(quit_note_shown, 30, "the quit note")
    assert "Traceback" not in pane_history()


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
        jobs={"j": {"host": "a", "spares": ["b"], **job_table(steps=200_000)}},
        lease_s=8.0,
        unattended_s=120.0,
    )
    command = f"env -u COLUMNS -u LINES OMP_NUM_THREADS=1 {HOTSPARE} --inventory {inventory} --policy auto"
    tmux("new-session", "-d", "-s", SESSION, "-x", "120", "-y", "40", command)
    tmux("set-option", "-t", SESSION, "remain-on-exit", "on")
    journal = inventory.parent / "state" / "journal.jsonl"

    def replica_on_b() -> bool:
        return any(e.kind is Kind.REPLICA and e.host == "b" for e in read(journal))

    until(lambda s: "Fleet" in s and "r2" in s, 30, "the Fleet view")
    until(lambda s: replica_on_b(), 90, "a replica on b")
    tmux("send-keys", "-t", SESSION, "-l", ":")
    # typed before the palette is open, the keys would reach the screen under it (CI: lost)
    until(lambda s: "Search for commands" in s, 10, "the palette open")
    tmux("send-keys", "-t", SESSION, "-l", "kill a")
    until(lambda s: "SIGKILL its executors" in s, 10, "the palette's hit")
    tmux("send-keys", "-t", SESSION, "Enter")
    until(lambda s: "kill demo host a?" in s.lower(), 10, "the confirm")
    tmux("send-keys", "-t", SESSION, "y")
    tmux("send-keys", "-t", SESSION, "2")
    until(lambda s: "waiting out lease on a" in s, 20, "the lease wait in the Jobs view")
    until(lambda s: "b -> " in s and "running" in s, 60, "j running on b")
    tmux("send-keys", "-t", SESSION, "1")
    until(lambda s: "down" in s, 10, "a down in the Fleet view")
    tmux("send-keys", "-t", SESSION, "r")
    until(lambda s: "revive" in s.lower() or "up" in s, 10, "a revived")
    tmux("send-keys", "-t", SESSION, "3")
    until(lambda s: "host_lost" in s, 10, "the incident listed")
    tmux("send-keys", "-t", SESSION, "Enter")
    until(lambda s: "MTTR" in s and "first_step" in s, 10, "the incident's report")
    tmux("send-keys", "-t", SESSION, "Escape")
    until(lambda s: "MTTR:" not in s, 10, "back to the incidents")
    tmux("send-keys", "-t", SESSION, "q")
    until(quit_note_shown, 30, "the quit note")
    before = len(incidents(read(journal)))

    restarted = time.time()
    tmux("respawn-pane", "-k", "-t", SESSION, command)
    tmux("clear-history", "-t", SESSION)  # the first quit note must not answer for the second
    until(lambda s: "Fleet" in s and "r2" in s, 30, "the Fleet view again")
    until(
        lambda s: any(
            e.kind is Kind.EXECUTOR and "reattached to executor" in e.msg and e.t > restarted
            for e in read(journal)
        ),
        30,
        "the second console reattached",
    )
    tmux("send-keys", "-t", SESSION, "q")
    until(quit_note_shown, 30, "the second quit note")
    assert len(incidents(read(journal))) == before, "no incident for a console that quit cleanly"
