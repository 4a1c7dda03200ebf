"""Deployment and preflight over real sshd hosts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from support.fleetbed import write_inventory
from support.helpers import REPO, env_with

from console.inventory import load
from console.reach.deploy import build_bundle, deploy
from console.reach.transport.factory import open_transport


async def test_deploying_twice_uploads_once_and_the_bundle_runs(ssh_hosts, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    (h,) = ssh_hosts(1)
    inv = load(
        write_inventory(tmp_path / "inventory.toml", hosts={"h": h.inventory_table()}, jobs={})
    )
    t = open_transport(inv, "h")
    async with t:
        first = await deploy(t, str(h.root), sys.executable)
        marker = Path(first.path) / ".complete"
        stamp = marker.stat().st_mtime_ns
        second = await deploy(t, str(h.root), sys.executable)
        version = await t.run(
            [sys.executable, "-m", "executors.cli", "version"], env={"PYTHONPATH": first.path}
        )
    assert (first.uploaded, second.uploaded) == (True, False)
    assert marker.stat().st_mtime_ns == stamp
    assert version.stdout.strip().endswith(build_bundle().hash), (
        "the deployed code is the bundle it was hashed as"
    )


def test_check_passes_good_hosts_and_names_one_without_torch(ssh_hosts, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    good, bare = ssh_hosts(2)
    venv = tmp_path / "notorch"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    inv = write_inventory(
        tmp_path / "inventory.toml",
        jobs={},
        hosts={
            "good": good.inventory_table(),
            "bare": bare.inventory_table(python=str(venv / "bin" / "python")),
        },
    )
    r = subprocess.run(
        [sys.executable, "-m", "console.cli", "--inventory", str(inv), "check", "--deploy"],
        capture_output=True,
        text=True,
        env=env_with(),
        cwd=REPO,
        timeout=120,
    )
    assert r.returncode == 1, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert any(line.startswith("good ") and line.rstrip().endswith("ok") for line in lines)
    assert any(line.startswith("bare ") and line.rstrip().endswith("FAIL") for line in lines)
    assert "bare: torch does not import: ModuleNotFoundError" in r.stdout
