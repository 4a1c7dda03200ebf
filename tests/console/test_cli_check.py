"""``hotspare check``: validate, deploy and preflight every host; say what is wrong in words."""

from __future__ import annotations

import importlib.metadata
import json
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.helpers import REPO, env_with

HOSTS = ["local-a", "local-b", "local-c"]
PYTHON_VERSION = "{}.{}.{}".format(*sys.version_info[:3])
NOT_DEPLOYED = re.compile(
    r"^local-[abc]: note: executor bundle [0-9a-f]{12} is not deployed yet: the console deploys "
    r"it before it starts an executor here \(`hotspare check --deploy` deploys it now\)$"
)


def check(inventory: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "console.cli", "--inventory", str(inventory), "check", *args],
        cwd=REPO,
        env=env_with(),
        capture_output=True,
        text=True,
        timeout=240,
    )


@dataclass
class Table:
    header: list[str]
    rows: dict[str, list[str]]
    """host -> its cells (split on runs of two or more spaces)."""
    problems: list[str]
    """The lines after the table: ``HOST: reason``."""

    def status(self, host: str) -> str:
        return self.rows[host][-1]

    def cell(self, host: str, column: str) -> str:
        return self.rows[host][self.header.index(column)]


def table(stdout: str, hosts: list[str]) -> Table:
    lines = stdout.splitlines()
    header = re.split(r"\s{2,}", lines[0].strip())
    assert header[0] == "HOST" and header[-1] == "STATUS", lines[0]
    rows = {}
    for line in lines[1 : 1 + len(hosts)]:
        cells = re.split(r"\s{2,}", line.strip())
        assert len(cells) == len(header), line
        rows[cells[0]] = cells
    assert sorted(rows) == sorted(hosts)
    return Table(header, rows, lines[1 + len(hosts) :])


def no_traceback(r: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in r.stdout + r.stderr
    assert r.stderr == ""


@dataclass
class Shipped:
    folder: Path
    inventory: Path
    before: subprocess.CompletedProcess[str]
    made_before: list[str]
    """What the check before deploying left in the folder besides the inventory."""
    before_json: subprocess.CompletedProcess[str]
    deployed: subprocess.CompletedProcess[str]
    markers: dict[str, int]
    again: subprocess.CompletedProcess[str]


# the module-wide reference is made once, on the one worker that runs the whole module
pytestmark = pytest.mark.xdist_group(__name__)


@pytest.fixture(scope="module")
def shipped(tmp_path_factory: pytest.TempPathFactory) -> Shipped:
    """A copy of the shipped inventory, checked before deploying, with --deploy, then again."""
    folder = tmp_path_factory.mktemp("shipped")
    inventory = folder / "inventory.toml"
    shutil.copy(REPO / "inventory.toml", inventory)
    before = check(inventory)
    before_json = check(inventory, "--json")
    made_before = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*"))
    made_before.remove("inventory.toml")
    deployed = check(inventory, "--deploy")
    markers = {
        p.relative_to(folder).as_posix(): p.stat().st_mtime_ns
        for p in folder.glob(".hotspare/hosts/*/bundles/*/.complete")
    }
    again = check(inventory, "--json", "--deploy")
    return Shipped(folder, inventory, before, made_before, before_json, deployed, markers, again)


def test_check_before_deploying_passes_and_notes_the_bundle_the_console_will_deploy(
    shipped: Shipped,
) -> None:
    """A fresh clone's shipped inventory checks ok: the console deploys the bundle itself."""
    r = shipped.before
    no_traceback(r)
    assert r.returncode == 0, r.stdout
    t = table(r.stdout, HOSTS)
    for host in HOSTS:
        assert t.status(host) == "ok"
        assert t.cell(host, "BUNDLE") == "no"
        assert t.cell(host, "PYTHON") == PYTHON_VERSION
        assert t.cell(host, "DISK FREE").endswith(" GiB")
    # exactly one line per host, and it is a note about the bundle
    assert sorted(p.split(": ", 1)[0] for p in t.problems) == HOSTS
    for line in t.problems:
        assert NOT_DEPLOYED.search(line), line

    js = shipped.before_json
    no_traceback(js)
    assert js.returncode == 0, js.stdout
    doc = json.loads(js.stdout)
    assert (doc["ok"], doc["error"]) == (True, None)
    for d in doc["hosts"]:
        assert (d["ok"], d["problems"], d["bundle"]) == (True, [], False)
        assert len(d["notes"]) == 1 and "not deployed yet" in d["notes"][0]


def test_check_before_deploying_creates_nothing(shipped: Shipped) -> None:
    assert shipped.made_before == [], "checking only looks: no state dir, no host folders"


def test_check_with_deploy_passes_on_the_shipped_hosts(shipped: Shipped) -> None:
    r = shipped.deployed
    no_traceback(r)
    assert r.returncode == 0, r.stdout
    t = table(r.stdout, HOSTS)
    assert t.problems == []
    for host in HOSTS:
        assert t.status(host) == "ok"
        assert t.cell(host, "BUNDLE") == "yes"
        assert t.cell(host, "TRANSPORT") == "local"
        assert t.cell(host, "TORCH") == importlib.metadata.version("torch")
    assert t.cell("local-c", "REGION") == "eu-west"
    # the roots of the copy sit beside the copy
    assert sorted(m.split("/")[2] for m in shipped.markers) == HOSTS


def test_check_json_after_deploying(shipped: Shipped) -> None:
    r = shipped.again
    no_traceback(r)
    assert r.returncode == 0, r.stdout
    doc = json.loads(r.stdout)
    assert sorted(doc) == ["error", "hosts", "ok"], "the same shape as on error"
    assert (doc["ok"], doc["error"]) == (True, None)
    results = doc["hosts"]
    assert len(results) == 3
    free = re.findall(r'"disk_free_mb": ([0-9.]+)', r.stdout)
    assert len(free) == 3 and all(re.fullmatch(r"\d+(\.\d)?", mb) for mb in free), free
    assert sorted(d["host"] for d in results) == HOSTS
    for d in results:
        assert d["ok"] is True
        assert d["problems"] == [] and d["notes"] == []
        assert d["python"] == PYTHON_VERSION
        assert d["torch"] == importlib.metadata.version("torch")
        assert d["bundle"] is True
        assert d["disk_free_mb"] > 0
        assert isinstance(d["cuda_devices"], int)


def test_deploying_again_uploads_nothing(shipped: Shipped) -> None:
    after = {
        p.relative_to(shipped.folder).as_posix(): p.stat().st_mtime_ns
        for p in shipped.folder.glob(".hotspare/hosts/*/bundles/*/.complete")
    }
    assert after == shipped.markers
    assert len(after) == 3


@pytest.fixture(scope="module")
def python_without_torch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    venv = tmp_path_factory.mktemp("notorch") / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120
    )
    python = venv / "bin" / "python"
    probe = subprocess.run([str(python), "-c", "import torch"], capture_output=True, text=True)
    assert probe.returncode != 0, "the venv must not see torch"
    assert "No module named 'torch'" in probe.stderr
    return python


def _two_hosts(path: Path, other: str, python: str) -> Path:
    path.write_text(
        "[regions.r]\n"
        '[hosts.good]\nregion = "r"\ntransport = "local"\nroot = "good"\n'
        f'[hosts.{other}]\nregion = "r"\ntransport = "local"\nroot = "{other}"\n'
        f"python = {json.dumps(python)}\n",
        encoding="utf-8",
    )
    return path


@pytest.mark.long  # the suite names a host without torch over sshd (reach/test_deploy_ssh), on the same check
def test_check_names_the_host_without_torch(tmp_path: Path, python_without_torch: Path) -> None:
    inventory = _two_hosts(tmp_path / "inventory.toml", "notorch", str(python_without_torch))
    r = check(inventory, "--deploy")
    no_traceback(r)
    assert r.returncode == 1
    t = table(r.stdout, ["good", "notorch"])
    assert t.status("good") == "ok"
    assert t.status("notorch") == "FAIL"
    assert t.cell("notorch", "TORCH") == "-"
    assert t.cell("notorch", "BUNDLE") == "yes"  # deployed; only torch is missing
    assert len(t.problems) == 1
    assert t.problems[0].startswith("notorch: ")
    assert "torch does not import: ModuleNotFoundError: No module named 'torch'" in t.problems[0]

    js = check(inventory, "--json")
    no_traceback(js)
    assert js.returncode == 1
    doc = json.loads(js.stdout)
    assert (doc["ok"], doc["error"]) == (False, None), "a host failed; the check itself ran"
    by_host = {d["host"]: d for d in doc["hosts"]}
    assert by_host["good"]["ok"] is True
    assert by_host["notorch"]["ok"] is False
    assert by_host["notorch"]["torch"] is None
    assert by_host["notorch"]["python"] == PYTHON_VERSION
    assert [p for p in by_host["notorch"]["problems"] if "torch does not import" in p]


@pytest.mark.parametrize("deploy", [False, True], ids=["preflight", "deploy"])
def test_check_names_a_host_whose_python_does_not_exist(tmp_path: Path, deploy: bool) -> None:
    missing = tmp_path / "no such folder" / "python3"
    inventory = _two_hosts(tmp_path / "inventory.toml", "nopython", str(missing))
    r = check(inventory, *(["--deploy"] if deploy else []))
    no_traceback(r)
    assert r.returncode == 1
    t = table(r.stdout, ["good", "nopython"])
    assert t.status("nopython") == "FAIL"
    assert t.cell("nopython", "PYTHON") == "-"
    assert t.status("good") == "ok", "a bundle not deployed yet is no failure"
    mine = [p for p in t.problems if p.startswith("nopython: ")]
    assert len(mine) == 1
    assert f"cannot run {missing}: No such file or directory" in mine[0]


def test_check_names_a_python_that_does_not_run(tmp_path: Path) -> None:
    inventory = tmp_path / "inventory.toml"
    inventory.write_text(
        '[regions.r]\n[hosts.broken]\nregion = "r"\ntransport = "local"\nroot = "b"\n'
        'python = "/bin/false"\n'
    )
    r = check(inventory)
    no_traceback(r)
    assert r.returncode == 1
    t = table(r.stdout, ["broken"])
    assert t.problems == ["broken: /bin/false does not run: exit 1"]


def test_check_names_a_root_that_cannot_be_made_and_makes_nothing(tmp_path: Path) -> None:
    (tmp_path / "a file").write_text("not a folder")
    inventory = tmp_path / "inventory.toml"
    inventory.write_text(
        '[regions.r]\n[hosts.h]\nregion = "r"\ntransport = "local"\nroot = "a file/hosts/h"\n'
        '[hosts.fresh]\nregion = "r"\ntransport = "local"\nroot = "new/hosts/fresh"\n'
    )
    r = check(inventory)
    no_traceback(r)
    assert r.returncode == 1
    t = table(r.stdout, ["h", "fresh"])
    assert (t.status("h"), t.status("fresh")) == ("FAIL", "ok")
    assert (
        f"h: cannot use {tmp_path / 'a file/hosts/h'}: {tmp_path / 'a file'} is not a folder"
        in (t.problems)
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a file", "inventory.toml"]
