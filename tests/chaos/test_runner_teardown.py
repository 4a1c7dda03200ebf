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
from helpers import REPO, env_with, wait_for


def _namespaces(prefix: str) -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30)
    return [line.split()[0] for line in out.stdout.splitlines() if line.startswith(prefix)]


def _alive(procs: list[psutil.Process]) -> list[str]:
    left = []
    for p in procs:
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                left.append(" ".join(p.cmdline())[:120])
        except psutil.NoSuchProcess:
            pass
    return left


@pytest.mark.skipif(shutil.which("ip") is None, reason="needs iproute2 (network namespaces)")
def test_a_chaos_run_ended_by_sigterm_leaves_no_process_namespace_or_mount() -> None:
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
    try:
        console = wait_for(
            lambda: (
                runner.poll() is not None
                or [
                    p for p in me.children(recursive=True) if "console.cli" in " ".join(p.cmdline())
                ]
            ),
            180,
            "the episode's console running",
        )
        assert runner.poll() is None, runner.communicate()[1][-2000:]
        assert console and _namespaces(prefix), "the fleet is up: its namespaces exist"
        fleet = me.children(recursive=True)
        folders = {
            part.split("/")[2] for p in fleet for part in p.cmdline() if part.startswith("/tmp/cz-")
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
    assert folders and not [f for f in folders if f"/tmp/{f}/" in mounts], "its disks unmounted"
    assert not [f for f in folders if os.path.exists(f"/tmp/{f}")], "its folder removed"
