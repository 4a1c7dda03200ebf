"""The provisioner: a command that makes a host when a job needs one. Its failures (exit 1,
output that is not a host table, a hang, a host that fails its preflight) are one alert line
each and a retry after a growing wait, never a crash; a host it prints is checked against the
inventory, preflighted and has the executor deployed before it is added.

Real subprocesses (small Python scripts), a real journal, a real inventory file and the real
preflight and deploy on the local host; the host table added is the one the script printed.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest
from support.fleetbed import local_host, until, write_inventory

from console.fleet.provision import Provisioner
from console.inventory import ProvisionerSettings, with_host
from console.reach.check import ready_host
from console.reach.deploy import MARKER, build_bundle, bundle_dir
from console.records.journal import Journal, Kind, read

ROOT = Path(__file__).resolve().parents[3]
LOCAL = ROOT / "examples" / "provision_local.py"


class Bed:
    def __init__(
        self,
        tmp: Path,
        command: list[str],
        *,
        attempts: int = 3,
        regions: tuple[str, ...] = ("r1",),
        **over: Any,
    ) -> None:
        self.inventory = write_inventory(
            tmp / "inventory.toml",
            hosts={"a": local_host(tmp / "a"), "b": local_host(tmp / "b")},
            jobs={},
            regions=regions,
        )
        self.journal = Journal(tmp / "journal.jsonl")
        self.path = tmp / "journal.jsonl"
        self.added: list[tuple[str, dict[str, Any]]] = []
        self.gone: set[str] = set()
        """Added hosts released since."""
        self.leaving: set[str] = set()
        """Added hosts chosen for release (out of use) since."""
        self.alerts: list[str] = []
        self.attempts = attempts
        settings = ProvisionerSettings(
            command=command, **{"timeout_s": 1.0, "retry_s": 0.05, "retry_max_s": 0.2, **over}
        )
        self.p = Provisioner(
            settings,
            prepare=lambda n, table: ready_host(with_host(self.inventory, n, table), n),
            add=self.add,
            known=lambda: {"a", "b"},
            provisioned=lambda: {n: t["region"] for n, t in self.added if n not in self.gone},
            wanted=self.wanted,
            free_in=lambda r: sum(
                1 for n, t in self.added if t["region"] == r and n not in self.leaving
            ),
            journal=self.journal,
            alert=self.alerts.append,
        )

    def add(self, name: str, table: dict[str, Any]) -> None:
        self.added.append((name, table))

    def keep(
        self, busy: Callable[[str], bool], released: Callable[[str], None], every_s: float
    ) -> Coroutine[None, None, None]:
        """``Provisioner.keep``, a host chosen for release noted in ``leaving``."""
        return self.p.keep(
            busy,
            released,
            releasing=self.leaving.add,
            quiet=lambda _h: asyncio.sleep(0),
            chosen=self.leaving.__contains__,
            every_s=every_s,
        )

    def wanted(self) -> bool:
        return len(self.tries()) < self.attempts

    def tries(self) -> list[dict[str, Any]]:
        return [e.data for e in read(self.path) if e.kind is Kind.ACTION and "provision" in e.data]


def script(tmp: Path, body: str) -> list[str]:
    path = tmp / "prov.py"
    path.write_text(body)
    return [sys.executable, str(path)]


async def settled(bed: Bed, timeout: float = 60) -> None:
    # a deadline, not a wait: a made host's preflight imports torch and its deploy copies the
    # bundle (five workers on two cores once took the provisioner past 20 s)
    await until(lambda: not bed.p.busy, timeout, "the provisioner to settle")


async def test_a_host_it_prints_is_added(tmp_path: Path) -> None:
    made = tmp_path / "hosts"
    bed = Bed(tmp_path, [sys.executable, str(LOCAL), "--root", str(made)], timeout_s=10.0)
    bed.p.want("a job waits for a host")
    await settled(bed)
    assert bed.added == [
        (
            "prov-1",
            {"region": "r1", "transport": "local", "root": str(tmp_path / "hosts" / "prov-1")},
        )
    ]
    assert (tmp_path / "hosts" / "prov-1").is_dir()
    marker = Path(bundle_dir(str(tmp_path / "hosts" / "prov-1"), build_bundle()), MARKER)
    assert marker.is_file(), "the executor was deployed before the host was added"
    done = [d for d in bed.tries() if d["provision"] == "done"]
    assert len(done) == 1 and done[0]["host"] == "prov-1"
    parts = done[0]["made_s"] + done[0]["preflight_s"] + done[0]["deploy_s"]
    assert done[0]["preflight_s"] > 0 and done[0]["deploy_s"] > 0
    assert parts <= done[0]["seconds"]
    assert not bed.alerts


async def test_a_host_that_fails_its_preflight_is_released_and_another_made(
    tmp_path: Path,
) -> None:
    hosts = tmp_path / "hosts"
    # the first host made has an interpreter that does not run; the second is fine
    body = (
        "import json, sys\nfrom pathlib import Path\n"
        f"root = Path({str(hosts)!r})\n"
        "n = 1\n"
        "while (root / f'prov-{n}').exists() or (root / f'gone-{n}').exists():\n"
        "    n += 1\n"
        "(root / f'prov-{n}').mkdir(parents=True)\n"
        "table = {'name': f'prov-{n}', 'region': 'r1', 'transport': 'local',\n"
        "         'root': str(root / f'prov-{n}')}\n"
        "if n == 1:\n"
        "    table['python'] = str(root / 'no-python')\n"
        "print(json.dumps(table))\n"
    )
    release = tmp_path / "release.py"
    release.write_text(
        "import sys\nfrom pathlib import Path\n"
        f"root = Path({str(hosts)!r})\n"
        "(root / sys.argv[1]).rename(root / sys.argv[1].replace('prov-', 'gone-'))\n"
    )
    bed = Bed(tmp_path, script(tmp_path, body), release=[sys.executable, str(release)])
    bed.p.want("a job waits for a host")
    await settled(bed, 60)
    assert [n for n, _ in bed.added] == ["prov-2"], "the unusable host is never added"
    assert (hosts / "gone-1").is_dir() and not (hosts / "prov-1").exists(), "given back"
    failed = [d for d in bed.tries() if d["provision"] == "failed"]
    assert len(failed) == 1 and "prov-1 failed its preflight" in failed[0]["error"]
    assert "no-python" in failed[0]["error"]
    released = [e.data for e in read(bed.path) if e.kind is Kind.ACTION and "release" in e.data]
    assert [(d["release"], d["host"]) for d in released] == [("done", "prov-1")]
    assert len(bed.alerts) == 1 and "\n" not in bed.alerts[0]


@pytest.mark.parametrize(
    ("body", "said"),
    [
        (
            "import sys\nprint('quota exceeded', file=sys.stderr)\nsys.exit(1)\n",
            "exited 1: quota exceeded",
        ),
        ("print('<html>oops</html>')\n", "its output is not JSON: '<html>oops</html>'"),
        ("print('[1, 2]')\n", "not a JSON object"),
        ('print(\'{"region": "r1"}\')\n', "no usable name: None"),
        ('print(\'{"name": "a", "region": "r1"}\')\n', "'a', a host the inventory already has"),
        ("import time\ntime.sleep(60)\n", "no answer within timeout_s = 1 s (killed)"),
    ],
    ids=["exit-1", "garbage", "not-an-object", "no-name", "known-name", "hang"],
)
async def test_a_failure_is_one_alert_line_and_a_retry_never_a_crash(
    tmp_path: Path, body: str, said: str
) -> None:
    bed = Bed(tmp_path, script(tmp_path, body))
    t0 = time.monotonic()
    bed.p.want("a job waits for a host")
    await settled(bed, 30)
    assert not bed.added
    failed = [d for d in bed.tries() if d["provision"] == "failed"]
    assert len(failed) == 2, "tried again while a job still wanted a host, then stopped"
    assert all(said in d["error"] for d in failed), failed
    assert len(bed.alerts) == 2 and all("\n" not in a for a in bed.alerts)
    assert all(a.startswith("provisioner failed after ") and said in a for a in bed.alerts)
    if "hang" in said or "timeout" in said:
        assert time.monotonic() - t0 < 10, "the hung command was killed at its timeout"


async def test_a_hung_provisioner_s_children_are_killed_with_it(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    body = (
        "import subprocess, sys, time\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"open({str(pidfile)!r}, 'w').write(str(p.pid))\n"
        "time.sleep(60)\n"
    )
    bed = Bed(tmp_path, script(tmp_path, body), attempts=1)
    bed.p.want("a job waits for a host")
    await settled(bed, 30)
    child = int(pidfile.read_text())
    await until(lambda: not Path(f"/proc/{child}").exists() or _zombie(child), 10, "child gone")


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except OSError:
        return True


async def test_a_host_the_inventory_refuses_is_a_failure_with_its_reason(tmp_path: Path) -> None:
    bed = Bed(
        tmp_path,
        [sys.executable, str(LOCAL), "--root", str(tmp_path / "hosts"), "--region", "mars"],
    )
    bed.p.want("a job waits for a host")
    await settled(bed)
    assert not bed.added
    failed = [d for d in bed.tries() if d["provision"] == "failed"]
    assert failed and "hosts.prov-1" in failed[0]["error"] and "mars" in failed[0]["error"]
    assert "inventory.toml" in failed[0]["error"], failed[0]["error"]


async def test_one_at_a_time_and_never_past_max_hosts(tmp_path: Path) -> None:
    bed = Bed(
        tmp_path,
        [sys.executable, str(LOCAL), "--root", str(tmp_path / "hosts"), "--delay", "0.3"],
        max_hosts=1,
    )
    bed.p.want("first")
    bed.p.want("second, while the first is on its way")
    await settled(bed)
    assert [n for n, _ in bed.added] == ["prov-1"]
    bed.p.want("third, with one held")
    await asyncio.sleep(0)
    assert not bed.p.busy and [n for n, _ in bed.added] == ["prov-1"]
    assert any("max_hosts" in a for a in bed.alerts)


async def test_an_idle_provisioned_host_is_released_and_a_failed_release_retried(
    tmp_path: Path,
) -> None:
    hosts = tmp_path / "hosts"
    local = [sys.executable, str(LOCAL), "--root", str(hosts)]
    flaky = tmp_path / "release.py"
    flaky.write_text(
        "import subprocess, sys\nfrom pathlib import Path\n"
        f"marker = Path({str(tmp_path / 'tried')!r})\n"
        "if not marker.exists():\n"
        "    marker.write_text('1')\n"
        "    print('api timeout', file=sys.stderr)\n"
        "    sys.exit(3)\n"
        f"sys.exit(subprocess.call({local!r} + ['--release', sys.argv[1]]))\n"
    )
    bed = Bed(
        tmp_path,
        local,
        release=[sys.executable, str(flaky)],
        idle_release_s=0.3,
        attempts=1,
    )
    bed.p.want("a job waits for a host")
    await settled(bed)
    assert (hosts / "prov-1").is_dir()
    busy = {"prov-1": True}
    released: list[str] = []
    keep = asyncio.create_task(bed.keep(lambda h: busy[h], released.append, every_s=0.05))
    try:
        await asyncio.sleep(0.6)
        assert not released, "a busy host is kept however long"
        busy["prov-1"] = False
        await until(lambda: released, 10, "prov-1 released")
    finally:
        keep.cancel()
        await asyncio.gather(keep, return_exceptions=True)
    assert released == ["prov-1"] and not (hosts / "prov-1").exists()
    data = [e.data for e in read(bed.path) if e.kind is Kind.ACTION and "release" in e.data]
    assert [d["release"] for d in data] == ["chosen", "failed", "done"]
    assert "exited 3: api timeout" in data[1]["error"]
    assert any("releasing prov-1 failed" in a for a in bed.alerts)


async def test_min_spares_provisions_for_the_short_region_and_keeps_it_from_release(
    tmp_path: Path,
) -> None:
    hosts = tmp_path / "hosts"
    local = [sys.executable, str(LOCAL), "--root", str(hosts)]  # region from HOTSPARE_REGION
    bed = Bed(
        tmp_path,
        local,
        regions=("r1", "r2"),
        release=[*local, "--release"],
        idle_release_s=0.1,
        min_spares={"r2": 1},
    )
    looks: list[str] = []
    keep = asyncio.create_task(bed.keep(idle(looks), bed.gone.add, every_s=0.05))
    try:
        await until(lambda: bed.added, 20, "a host provisioned for r2")
        await settled(bed)
        # looked at 20 times (1 s) while idle, past idle_release_s = 0.1 s: still kept, as
        # r2 would be short without it
        await until(lambda: looks.count("prov-1") >= 20, 10, "prov-1 looked at, idle")
        assert not bed.gone, "the region's only free host is not released"
    finally:
        keep.cancel()
        await asyncio.gather(keep, return_exceptions=True)
    assert [(n, t["region"]) for n, t in bed.added] == [("prov-1", "r2")]
    assert (hosts / "prov-1").is_dir()
    start = [d for d in bed.tries() if d["provision"] == "start"]
    assert [d["region"] for d in start] == ["r2"], "provisioned once, for r2"


def idle(looks: list[str]) -> Callable[[str], bool]:
    """``busy`` for ``keep``: every host idle; each look at one is noted."""

    def busy(host: str) -> bool:
        looks.append(host)
        return False

    return busy


async def test_a_host_printed_in_another_region_than_min_spares_asked_is_refused(
    tmp_path: Path,
) -> None:
    hosts = tmp_path / "hosts"
    local = [sys.executable, str(LOCAL), "--root", str(hosts)]
    bed = Bed(
        tmp_path,
        [*local, "--region", "r1"],  # ignores HOTSPARE_REGION
        regions=("r1", "r2"),
        release=[*local, "--release"],
        min_spares={"r2": 1},
    )
    bed.p.want("r2 has 0 free hosts, min_spares 1", "r2")

    def given_back() -> bool:
        return any(e.kind is Kind.ACTION and "release" in e.data for e in read(bed.path))

    await until(given_back, 20, "a failed attempt, its host given back")
    await bed.p.close()
    assert not bed.added
    failed = [d for d in bed.tries() if d["provision"] == "failed"]
    assert "in region 'r1', not 'r2' (HOTSPARE_REGION)" in failed[0]["error"]
    assert not (hosts / "prov-1").exists(), "the host it made was given back"


async def test_an_idle_host_past_its_region_s_min_spares_is_released(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    local = [sys.executable, str(LOCAL), "--root", str(hosts), "--region", "r1"]
    bed = Bed(
        tmp_path,
        local,
        attempts=1,
        release=[*local[:4], "--release"],
        idle_release_s=0.1,
        min_spares={"r1": 1},
    )
    for _ in range(2):  # two made for waiting jobs, one more than r1 keeps
        bed.p.want("a job waits for a host")
        await settled(bed)
        bed.attempts += 1
    assert [n for n, _ in bed.added] == ["prov-1", "prov-2"]
    looks: list[str] = []
    keep = asyncio.create_task(bed.keep(idle(looks), bed.gone.add, every_s=0.05))
    try:
        await until(lambda: bed.gone, 10, "one released")
        kept = ({"prov-1", "prov-2"} - bed.gone).pop()
        seen = looks.count(kept)
        await until(lambda: looks.count(kept) >= seen + 10, 10, "the kept host looked at again")
    finally:
        keep.cancel()
        await asyncio.gather(keep, return_exceptions=True)
    assert len(bed.gone) == 1, "one released, one kept for r1's min_spares"
    assert [p.name for p in hosts.glob("prov-*")] == [kept]


async def test_a_provision_in_flight_when_the_console_closes_is_killed_with_its_children(
    tmp_path: Path,
) -> None:
    pids = tmp_path / "pids"
    body = (
        "import os, subprocess, sys, time\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"open({str(pids)!r}, 'w').write(f'{{os.getpid()}} {{p.pid}}')\n"
        "time.sleep(60)\n"
    )
    bed = Bed(tmp_path, script(tmp_path, body), timeout_s=120.0)
    bed.p.want("a job waits for a host")
    await until(lambda: pids.exists() and len(pids.read_text().split()) == 2, 20, "running")
    await bed.p.close()
    for pid in map(int, pids.read_text().split()):
        await until(lambda p=pid: not Path(f"/proc/{p}").exists() or _zombie(p), 10, "gone")
    assert not bed.added
