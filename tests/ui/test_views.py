"""Views of a controller service, in real terminals: training never pauses for a view, and
two views at once (one acting, one read-only) see one controller.

Evidence is the kernel's and the executor's: the training process's CPU time in ``/proc``, its
pid and start time, its own events, the state dir's lock holder.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from chaos.observe import executor_events, last_step
from support.tmuxbed import lock_holder, stop_controller, tmux, until_shown, view_command
from support.uibed import fleet

from console.records.console_lock import held
from console.records.journal import Kind, read

ACTING = f"hotspare-acting-{os.getpid()}"
WATCHING = f"hotspare-watching-{os.getpid()}"
LEASE_S = 3.0  # the tests' inventory (fleetbed.FAST_CONSOLE)
pytestmark = pytest.mark.usefixtures("reap_executors")  # conftest: its processes killed after


def cpu_ticks(pid: int) -> int:
    """utime + stime of the whole process (every thread), in clock ticks."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def proc_state(pid: int) -> str:
    """What the kernel says of ``pid`` now (its state and where it waits), for a failure."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        wchan = Path(f"/proc/{pid}/wchan").read_text()
    except OSError:
        return "it is gone"
    return f"state {fields[0]}, parent {fields[1]}, waiting in {wchan or '-'}"


def dead(pid: int) -> bool:
    """Ended: gone, or a zombie its parent has not reaped yet (CI saw tmux leave the killed
    view a zombie for over a minute, the pane not yet marked dead)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state in ("Z", "X")


def start_time(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])


@pytest.fixture
def sessions() -> Iterator[None]:
    for s in (ACTING, WATCHING):
        subprocess.run(["tmux", "kill-session", "-t", s], capture_output=True, timeout=10)
    yield
    for s in (ACTING, WATCHING):
        subprocess.run(["tmux", "kill-session", "-t", s], capture_output=True, timeout=10)


def open_view(session: str, inventory: Path, *extra: str) -> None:
    tmux(
        "new-session", "-d", "-s", session, "-x", "120", "-y", "40", view_command(inventory, *extra)
    )
    tmux("set-option", "-t", session, "remain-on-exit", "on")


def trains_on(workdir: Path, executor: int, born: int, leases: float) -> None:
    """For ``leases`` leases from now the same executor process trains: its CPU time and its
    step rise, and it never writes a stop."""
    ticks, step = cpu_ticks(executor), last_step(workdir)
    deadline = time.monotonic() + leases * LEASE_S
    while time.monotonic() < deadline:
        time.sleep(0.2)  # sampling the process while time passes (the property is the time)
        assert start_time(executor) == born, "the executor was replaced"
    assert cpu_ticks(executor) > ticks and last_step(workdir) > step, "it trained on"
    assert "stopped" not in [e.get("kind") for e in executor_events(workdir)]


def test_training_never_pauses_when_a_view_quits_or_is_killed(
    tmp_path: Path, sessions: None
) -> None:
    inventory = fleet(tmp_path, steps=400_000)
    state, workdir = tmp_path / "state", tmp_path / "a" / "jobs" / "j"
    open_view(ACTING, inventory, "--policy", "auto")
    until_shown(ACTING, lambda s: "acting view of controller" in s, 60, "the view attached")
    controller = lock_holder(state)
    until_shown(ACTING, lambda s: last_step(workdir) > 20, 120, "j training on a")
    executor = int((workdir / "executor.pid").read_text())
    born = start_time(executor)

    view = int(tmux("display-message", "-p", "-t", ACTING, "#{pane_pid}").strip())
    os.kill(view, signal.SIGKILL)  # the terminal closed, the laptop's lid, a lost VPN
    # dead once a zombie (CI saw tmux leave it unreaped past 60 s beside the suite); if it never
    # dies, say where it sat
    until_shown(
        ACTING,
        lambda s: dead(view) or "dead" in s,
        60,
        lambda: f"the killed view (pid {view}) to be gone; {proc_state(view)}",
    )
    trains_on(workdir, executor, born, leases=3.5)
    assert lock_holder(state) == controller

    tmux("respawn-pane", "-k", "-t", ACTING, screen_command(inventory))
    until_shown(ACTING, lambda s: f"controller pid {controller}" in s, 60, "a view attached again")
    tmux("send-keys", "-t", ACTING, "q")
    until_shown(
        ACTING,
        lambda s: (
            "keeps every job training"
            in tmux("capture-pane", "-p", "-J", "-S", "-100", "-t", ACTING)
        ),
        30,
        "the quit note",
    )
    trains_on(workdir, executor, born, leases=3.5)
    assert lock_holder(state) == controller
    stop_controller(inventory)


def screen_command(inventory: Path) -> str:
    return view_command(inventory)


def test_two_views_at_once_one_acting_one_read_only_see_one_controller(
    tmp_path: Path, sessions: None
) -> None:
    inventory = fleet(tmp_path, steps=400_000)
    state, workdir = tmp_path / "state", tmp_path / "a" / "jobs" / "j"
    open_view(ACTING, inventory, "--policy", "auto")
    until_shown(ACTING, lambda s: "acting view of controller" in s, 60, "the acting view")
    controller = lock_holder(state)
    open_view(WATCHING, inventory, "--read-only")
    until_shown(
        WATCHING,
        lambda s: f"READ-ONLY view: every action is off of controller pid {controller}" in s,
        60,
        "the read-only view of the same controller",
    )
    for s in (ACTING, WATCHING):
        tmux("send-keys", "-t", s, "2")
        until_shown(s, lambda shown: "running" in shown, 120, "j running in the Jobs view")

    tmux("send-keys", "-t", WATCHING, "s")
    until_shown(WATCHING, lambda s: "read-only console: stop j is off" in s, 10, "the refusal")
    assert "stopped" not in [e.get("kind") for e in executor_events(workdir)]

    tmux("send-keys", "-t", ACTING, "s")
    until_shown(ACTING, lambda s: "Stop j?" in s, 10, "the question")
    tmux("send-keys", "-t", ACTING, "y")
    until_shown(WATCHING, lambda s: "stopped" in s, 60, "the read-only view told j stopped")
    # from the executor's own events, and the controller's journal: one stop, by the acting view
    assert "stopped" in [e.get("kind") for e in executor_events(workdir)]
    actions = [e.msg for e in read(state / "journal.jsonl") if e.kind is Kind.ACTION]
    assert actions == ["stop j"], actions
    assert lock_holder(state) == controller

    # the palette stops the controller (asked first); the read-only view says it is gone
    tmux("send-keys", "-t", ACTING, "-l", ":")
    until_shown(ACTING, lambda s: "Search for commands" in s, 10, "the palette open")
    tmux("send-keys", "-t", ACTING, "-l", "stop the controller")
    until_shown(ACTING, lambda s: "unattended_s" in s, 10, "the palette's hit")
    tmux("send-keys", "-t", ACTING, "Enter")
    until_shown(
        ACTING, lambda s: f"Stop the controller (pid {controller})?" in s, 10, "the question"
    )
    tmux("send-keys", "-t", ACTING, "y")
    until_shown(
        ACTING,
        lambda s: (
            "was stopped from this view"
            in tmux("capture-pane", "-p", "-J", "-S", "-100", "-t", ACTING)
        ),
        30,
        "the view's closing note",
    )
    until_shown(WATCHING, lambda s: "NOT ANSWERING" in s, 30, "the read-only view told")
    assert not held(state)
    last = list(read(state / "journal.jsonl"))[-1]
    assert last.kind is Kind.CONSOLE and last.msg == "console stopped"
