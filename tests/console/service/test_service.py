"""The controller as a service (``hotspare serve``): it outlives a SIGKILL when a supervisor
restarts it within the lease, it is stopped cleanly by ``hotspare stop``, and its control
socket takes only its operator actions, from its own user.

Evidence is the kernel's and the files': children of the supervisor loop in ``/proc``, the
executor's pid and its own events, the state dir's lock, the socket's mode.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import time
from pathlib import Path

import pytest
from chaos.observe import executor_events, last_step
from support.servicebed import HOTSPARE, LEASE_S, env, inventory, start_time
from support.wait import wait_for as wait

from console.records.console_lock import held
from console.records.journal import Kind, read
from console.service.client import Remote
from console.service.wire import SOCKET_NAME


def children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def ended(pid: int) -> bool:
    """Gone, or a zombie (an orphan waits for init to reap it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in "ZX"
    except OSError:
        return True


def supervised(inv: Path, started: list[subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
    """``hotspare serve`` under a supervisor loop, as systemd's ``Restart=always``: started
    again the moment it ends, for as long as the loop runs."""
    loop = subprocess.Popen(
        ["sh", "-c", 'while :; do "$0" --inventory "$1" serve; done', str(HOTSPARE), str(inv)],
        env=env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    started.append(loop)
    return loop


def test_a_controller_sigkilled_and_restarted_by_its_supervisor_stops_no_executor(
    tmp_path: Path, reap: list[subprocess.Popen[bytes]]
) -> None:
    inv = inventory(tmp_path, lease_s=LEASE_S, suspect_after_s=2.0)
    workdir = tmp_path / "a" / "jobs" / "j"
    journal = tmp_path / "state" / "journal.jsonl"
    loop = supervised(inv, reap)
    first = wait(lambda: children(loop.pid), 30, "the controller under the loop")[0]  # type: ignore[index]
    wait(lambda: last_step(workdir) >= 40, 120, "j training on a")
    executor = int((workdir / "executor.pid").read_text())
    born = start_time(executor)

    killed_at = time.time()
    os.kill(first, signal.SIGKILL)
    second = wait(
        lambda: [p for p in children(loop.pid) if p != first], 30, "the controller restarted"
    )[0]  # type: ignore[index]
    wait(
        lambda: any(
            e.kind is Kind.EXECUTOR and "reattached" in e.msg and e.t > killed_at
            for e in read(journal)
        ),
        LEASE_S,
        "the restarted controller reattached",
    )
    at = last_step(workdir)
    # three leases past the kill: an executor whose lease was not renewed would have stopped
    wait(lambda: time.time() > killed_at + 3 * LEASE_S, 4 * LEASE_S, "three leases")
    assert last_step(workdir) > at, "the executor trained on after the restart"
    assert start_time(executor) == born, "the same executor process, never restarted"
    kinds = [e.get("kind") for e in executor_events(workdir)]
    assert "stopped" not in kinds and kinds.count("resumed") <= 1, kinds[-5:]
    assert "lease_lost" not in (workdir / "events.jsonl").read_text()
    state = json.loads((tmp_path / "state" / "state.json").read_text())
    assert state["jobs"]["j"]["epoch"] == 1, "no new epoch: the job never moved or restarted"
    assert children(loop.pid) == [second]

    loop.kill()  # the supervisor first, or it would start the controller again
    loop.wait(timeout=10)
    stop = subprocess.run(
        [HOTSPARE, "--inventory", str(inv), "stop"], capture_output=True, text=True, timeout=90
    )
    assert stop.returncode == 0, stop.stderr
    assert f"controller pid {second} stopped" in stop.stderr
    assert not held(tmp_path / "state")
    wait(lambda: ended(second), 30, "the controller process gone")
    last = list(read(journal))[-1]
    assert last.kind is Kind.CONSOLE and last.msg == "console stopped"


def test_the_control_socket_is_its_owners_alone_and_takes_only_operator_actions(
    tmp_path: Path, reap: list[subprocess.Popen[bytes]]
) -> None:
    inv = inventory(tmp_path)
    state = tmp_path / "state"
    serve = subprocess.Popen(
        [HOTSPARE, "--inventory", str(inv), "serve"],
        env=env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    reap.append(serve)
    remote = Remote(state)
    hello = wait(lambda: _hello(remote), 30, "the controller answering")
    assert hello["pid"] == serve.pid and hello["policy"] == "manual"  # type: ignore[index]
    mode = (state / SOCKET_NAME).stat().st_mode
    assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600

    with pytest.raises(ValueError, match="'close' is not an operator action"):
        remote.call("close")
    with pytest.raises(ValueError, match="no job or host named 'nope'"):
        remote.stop_job("nope")
    with socket.socket(socket.AF_UNIX) as raw:  # garbage: an error back, the controller lives on
        raw.settimeout(5)
        raw.connect(str(state / SOCKET_NAME))
        raw.sendall(b"{not json\n")
        assert b'"ok":false' in raw.recv(4096)
    assert remote.hello()["pid"] == serve.pid
    remote.close()

    busy = subprocess.run(
        [HOTSPARE, "--inventory", str(inv), "serve"], capture_output=True, text=True, timeout=60
    )
    assert busy.returncode == 2 and "another console holds this state dir" in busy.stderr
    assert "Traceback" not in busy.stderr

    stop = subprocess.run(
        [HOTSPARE, "--inventory", str(inv), "stop"], capture_output=True, text=True, timeout=90
    )
    assert stop.returncode == 0, stop.stderr
    assert serve.wait(timeout=30) == 0
    assert not (state / SOCKET_NAME).exists()
    again = subprocess.run(
        [HOTSPARE, "--inventory", str(inv), "stop"], capture_output=True, text=True, timeout=30
    )
    assert again.returncode == 1
    assert again.stderr.strip().splitlines() == [
        f"hotspare: no controller holds {state}; nothing to stop"
    ]


def _hello(remote: Remote) -> dict[str, object] | None:
    from console.service.client import ControllerGone

    try:
        return remote.hello()
    except ControllerGone:
        return None
