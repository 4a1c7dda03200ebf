"""A view on another machine (``hotspare --attach``): the controller's control socket and state
files over a real sshd, the view acting, a read-only one beside it, and training that never
pauses when a view's SSH link is cut or the view is SIGKILLed.

The "other machine" is an sshd on 127.0.0.N logging in as this user: the view reaches the
controller only through it (its socket forwarded, its files read over SFTP). Evidence is the
kernel's and the files': the executor's pid, start time and CPU time in ``/proc``, its own
``events.jsonl``, the controller's journal, the sshd's session processes.
"""

from __future__ import annotations

import getpass
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from chaos.observe import executor_events, last_step
from support import sshbed
from support.servicebed import HOTSPARE, LEASE_S, env, inventory, start_time
from support.tmuxbed import tmux, until_shown
from support.wait import wait_for as wait

from console.reach.transport.ssh_dial import SshTarget
from console.records.journal import Kind, read
from console.service.client import Remote
from console.service.tunnel import ControllerAt, ControllerTunnel
from protocol.errors import ConfigError

SESSION = f"hotspare-remote-view-{os.getpid()}"
SCREEN_POLL_S = 0.2


@pytest.fixture
def host() -> Iterator[sshbed.SshHost]:
    """The controller's machine, as the view reaches it: an sshd of its own."""
    with sshbed.ssh_bed() as bed:
        yield bed.host()


@pytest.fixture
def session() -> Iterator[None]:
    assert shutil.which("tmux"), "tmux is needed (scripts/test installs it)"
    subprocess.run(["tmux", "kill-session", "-t", SESSION], capture_output=True, timeout=10)
    yield
    subprocess.run(["tmux", "kill-session", "-t", SESSION], capture_output=True, timeout=10)


def address(host: sshbed.SshHost, state_dir: Path) -> str:
    return f"ssh://{getpass.getuser()}@{host.address}:{host.port}{state_dir}"


def target(host: sshbed.SshHost) -> SshTarget:
    return SshTarget(
        name=f"controller {host.address}",
        addresses=[host.address],
        port=host.port,
        user=getpass.getuser(),
        identity=str(host.bed.client_key),
        known_hosts=str(host.bed.known_hosts),
        connect_timeout=5.0,
    )


def cpu_ticks(pid: int) -> int:
    """utime + stime of the process (``/proc/PID/stat`` fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def cut_sessions(host: sshbed.SshHost) -> list[int]:
    """Every SSH session of the controller's machine SIGKILLed (its sshd stays): the links of
    the views on it are cut as a dropped network would cut them."""
    assert host.proc is not None
    cut = [p.pid for p in psutil.Process(host.proc.pid).children(recursive=True)]
    for pid in cut:
        os.kill(pid, signal.SIGKILL)
    return cut


def serve(inv: Path, started: list[subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [str(HOTSPARE), "--inventory", str(inv), "serve"],
        env=env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    started.append(proc)
    return proc


def journal_has(journal: Path, kind: Kind, text: str) -> bool:
    return any(e.kind is kind and text in e.msg for e in read(journal))


@pytest.mark.long  # the suite proves two views and their kill locally (tests/ui/test_views.py)
def test_views_over_ssh_one_acting_one_read_only_and_neither_a_cut_link_nor_a_kill_pauses_training(
    tmp_path: Path,
    reap: list[subprocess.Popen[bytes]],
    host: sshbed.SshHost,
    session: None,
) -> None:
    inv = inventory(tmp_path, lease_s=LEASE_S, suspect_after_s=2.0)
    state = tmp_path / "state"
    journal = state / "journal.jsonl"
    workdir = tmp_path / "a" / "jobs" / "j"
    controller = serve(inv, reap)
    wait(lambda: last_step(workdir) >= 20, 120, "j training on a")
    executor = int((workdir / "executor.pid").read_text())
    born = start_time(executor)

    # the acting view: the real command in a terminal, through the sshd only
    command = (
        f"env -u COLUMNS -u LINES OMP_NUM_THREADS=1 {HOTSPARE} --inventory {inv} "
        f"--attach {address(host, state)} --identity {host.bed.client_key} "
        f"--known-hosts {host.bed.known_hosts}"
    )
    tmux("new-session", "-d", "-s", SESSION, "-x", "160", "-y", "40", command)
    tmux("set-option", "-t", SESSION, "remain-on-exit", "on")
    shown = until_shown(
        SESSION,
        lambda s: f"controller pid {controller.pid}" in s and "over ssh" in s,
        60,
        "the title",
        SCREEN_POLL_S,
    )
    assert "acting view" in shown and host.address in shown
    # a read-only view beside it, on the same controller, through the same sshd
    tunnel = ControllerTunnel(ControllerAt(host.address, str(state)), target(host))
    tunnel.open(30)
    try:
        assert Remote(tunnel.local).hello()["pid"] == controller.pid
        # the acting view acts: its order lands in the controller's journal as done
        tmux("send-keys", "-t", SESSION, "2")
        until_shown(
            SESSION, lambda s: "running" in s, 60, "j running in the Jobs view", SCREEN_POLL_S
        )
        tmux("send-keys", "-t", SESSION, "c")
        wait(lambda: journal_has(journal, Kind.ACTION, "checkpoint j now"), 30, "the order")
        # the read-only view's mirror follows the controller's own files
        mirrored = tunnel.state_dir / "journal.jsonl"
        wait(
            lambda: mirrored.exists() and b"checkpoint j now" in mirrored.read_bytes(),
            30,
            "the order in the mirrored journal",
        )
        assert journal.read_bytes().startswith(mirrored.read_bytes()), "a copy, line for line"
        wait(
            lambda: (
                (tunnel.state_dir / "state.json").read_bytes()
                == (state / "state.json").read_bytes()
            ),
            30,
            "state.json mirrored",
        )

        # every view's link cut: both say so, and both come back on their own
        cut_at = time.monotonic()
        assert cut_sessions(host), "the views' sessions on the controller's machine"
        wait(lambda: tunnel.lost_since is not None, 30, "the read-only view losing its link")
        until_shown(
            SESSION,
            lambda s: "LOST since" in s,
            30,
            "the acting view saying its link is lost",
            SCREEN_POLL_S,
        )
        wait(lambda: tunnel.lost_since is None, 60, "the read-only view's link back")
        assert Remote(tunnel.local).hello()["pid"] == controller.pid
        until_shown(
            SESSION,
            lambda s: "LOST since" not in s and "over ssh" in s,
            60,
            "the link back",
            SCREEN_POLL_S,
        )

        # the acting view SIGKILLed, the read-only one closed
        view = int(tmux("display-message", "-p", "-t", SESSION, "#{pane_pid}").strip())
        os.kill(view, signal.SIGKILL)
    finally:
        tunnel.close()
    assert not tunnel.local.exists(), "the view's socket and mirror are removed"

    # training never paused: for more than 3 leases since the cut, the same executor process
    # keeps gaining CPU time and steps, and says nothing of stopping
    ticks, step = cpu_ticks(executor), last_step(workdir)
    while time.monotonic() - cut_at < 3.5 * LEASE_S:
        wait(lambda t=ticks: cpu_ticks(executor) > t, LEASE_S, "the executor's CPU time rising")
        wait(lambda s=step: last_step(workdir) > s, LEASE_S, "steps rising")
        ticks, step = cpu_ticks(executor), last_step(workdir)
    assert start_time(executor) == born, "the same executor process throughout"
    assert controller.poll() is None
    kinds = [e.get("type") for e in executor_events(workdir)]
    assert "Stopped" not in kinds and "Fault" not in kinds, kinds


def run_view(*args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(HOTSPARE), *args], capture_output=True, text=True, timeout=timeout, env=env()
    )


def test_bad_attach_input_is_one_line_and_a_non_zero_exit(
    tmp_path: Path, host: sshbed.SshHost
) -> None:
    inv = inventory(tmp_path)
    at = address(host, tmp_path / "nowhere")
    keys = ["--identity", str(host.bed.client_key)]
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    cases: list[tuple[list[str], int, str]] = [
        (["--attach", "ctl1"], 2, "--attach 'ctl1': not a controller's address"),
        (["--attach", "ctl1:relative/dir"], 2, "not a controller's address"),
        (["--attach", "ssh://ctl1:99999/x"], 2, "--attach 'ssh://ctl1:99999/x'"),
        (["--attach", "ctl1:/a/../b"], 2, "plain absolute path"),
        (["--identity", str(host.bed.client_key)], 2, "go with --attach"),
        (["--attach", at, "--identity", str(tmp_path / "nokey")], 2, "no such file"),
        (["--attach", at, *keys, "run"], 2, "are for the view, not `run`"),
        # the host key is checked: an empty known_hosts refuses it, and says how to trust it
        (["--attach", at, *keys, "--known-hosts", str(empty)], 1, "host key"),
        # reached, but no controller there
        (["--attach", at, *keys, "--known-hosts", str(host.bed.known_hosts)], 1, "no controller"),
    ]
    for args, code, words in cases:
        done = run_view("--inventory", str(inv), *args)
        assert done.returncode == code, (args, done.returncode, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and words in lines[0], (args, done.stderr)
        assert "Traceback" not in done.stderr
    assert not (tmp_path / "state").exists(), "nothing started on a bad --attach"


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("ops@ctl1:/srv/hs/.hotspare", ControllerAt("ctl1", "/srv/hs/.hotspare", "ops")),
        ("ctl1:/srv/hs/", ControllerAt("ctl1", "/srv/hs")),
        ("ssh://ops@10.0.0.5:2222/srv/hs", ControllerAt("10.0.0.5", "/srv/hs", "ops", 2222)),
        ("ssh://ctl1/srv/hs", ControllerAt("ctl1", "/srv/hs")),
    ],
)
def test_a_controller_address_is_read_as_scp_and_ssh_write_it(
    text: str, want: ControllerAt
) -> None:
    assert ControllerAt.parse(text) == want


@pytest.mark.parametrize(
    "text", ["ctl1", "ctl1:", "@ctl1:/x", "ssh://ctl1", "ssh://ctl1:x/y", "ssh:///x", "a b:/x"]
)
def test_a_controller_address_that_is_not_one_is_refused(text: str) -> None:
    with pytest.raises(ConfigError, match="--attach"):
        ControllerAt.parse(text)
