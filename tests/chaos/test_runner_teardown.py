"""``scripts/chaos`` ended by SIGTERM (a CI timeout, ``timeout``, a closed terminal) takes its
fleet down as Ctrl-C does. Before, the console, the sshd hosts and every executor under them,
the network namespaces and the tmpfs disks outlived it."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from support.helpers import REPO, env_with, wait_for


def _namespaces(prefix: str) -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30)
    return [line.split()[0] for line in out.stdout.splitlines() if line.startswith(prefix)]


def _cmdline(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except psutil.Error:  # gone, or a zombie: no command line
        return []


def _alive(procs: list[psutil.Process]) -> list[str]:
    left = []
    for p in procs:
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                left.append(" ".join(_cmdline(p))[:120] or str(p.pid))
        except psutil.NoSuchProcess:
            pass
    return left


@pytest.mark.skipif(shutil.which("ip") is None, reason="needs iproute2 (network namespaces)")
@pytest.mark.parametrize("when", ["building", "running"])
def test_a_chaos_run_ended_by_sigterm_leaves_no_process_namespace_or_mount(when: str) -> None:
    """Ended while its fleet is half built (a namespace made, its sshd maybe not), or once its
    console runs."""
    env = env_with()
    env["PYTHONPATH"] = f"{REPO}:{REPO / 'tests'}:{env['PYTHONPATH']}"
    runner = subprocess.Popen(
        [sys.executable, "-m", "chaos.runner", "--faults", "1", "--seed", "1"],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    me = psutil.Process(runner.pid)
    prefix = f"hs{runner.pid % 10000}x"

    def ready() -> bool:
        if when == "building":
            return bool(_namespaces(prefix))
        return any("console.cli" in " ".join(_cmdline(p)) for p in me.children())

    try:
        wait_for(lambda: runner.poll() is not None or ready(), 180, f"the fleet {when}")
        assert runner.poll() is None, runner.communicate()[1][-2000:]
        assert _namespaces(prefix), "its namespaces exist"
        fleet = me.children(recursive=True)
        folders = {
            part.split("/")[2] for p in fleet for part in _cmdline(p) if part.startswith("/tmp/cz-")
        }
        runner.send_signal(signal.SIGTERM)
        _, err = runner.communicate(timeout=180)
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait(30)
    assert runner.returncode == 128 + signal.SIGTERM, err[-2000:]
    assert "Traceback" not in err, err[-2000:]
    assert _alive(fleet) == [], "every process of the fleet is gone"
    assert _namespaces(prefix) == [], "its network namespaces are deleted"
    mounts = Path("/proc/mounts").read_text()
    assert not [f for f in folders if f"/tmp/{f}/" in mounts], "its disks unmounted"
    assert not [f for f in folders if os.path.exists(f"/tmp/{f}")], "its folder removed"
