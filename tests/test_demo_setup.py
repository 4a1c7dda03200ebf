"""The demo's files live under its state dir: a copy of the shipped inventory that resolves to
the same folders (so a host added with ``n`` changes no tracked file, and ``rm -rf .hotspare``
starts over), and one fake NVML per demo host (so a GPU FAIL edited into one drains that host
alone). Evidence: the inventories as the console loads them, and the executor's own health
command reading each host's file."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from console.inventory import append_host, load

REPO = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("demo_setup", REPO / "scripts" / "demo_setup.py")
assert spec is not None and spec.loader is not None
demo_setup = importlib.util.module_from_spec(spec)
spec.loader.exec_module(demo_setup)


def health(fake: str, workdir: Path) -> dict:  # type: ignore[type-arg]
    workdir.mkdir(exist_ok=True)
    env = {**os.environ, "HOTSPARE_FAKE_NVML": fake}
    out = subprocess.run(
        [sys.executable, "-m", "executors.cli", "health", "--workdir", str(workdir), "--json"],
        env=env, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return json.loads(out.stdout)


def test_the_demo_runs_on_a_copy_that_resolves_to_the_same_folders(short_tmp: Path) -> None:
    shipped = short_tmp / "inventory.toml"
    shipped.write_bytes((REPO / "inventory.toml").read_bytes())
    state = short_tmp / ".hotspare"
    env = demo_setup.setup(short_tmp, state)
    original, copy = load(shipped), load(state / "inventory.toml")
    assert copy.state_dir == original.state_dir == state.resolve()
    assert set(copy.hosts) == set(original.hosts) and len(copy.hosts) == 3
    for name in original.hosts:
        assert copy.host_root(name) == original.host_root(name)
    assert "# A real GPU host over SSH" in (state / "inventory.toml").read_text(), "comments kept"

    # a host added (what `n` does) goes to the copy; the shipped file is untouched
    before = shipped.read_bytes()
    append_host(state / "inventory.toml", "local-d", {"region": "us-east", "transport": "local",
                                                      "root": "hosts/local-d"})  # fmt: skip
    assert shipped.read_bytes() == before
    assert "local-d" in load(state / "inventory.toml").hosts
    # set up again (the demo started again): the copy with its added host is kept
    demo_setup.setup(short_tmp, state)
    assert "local-d" in load(state / "inventory.toml").hosts

    # one fake NVML per demo host: a fault in a's file is a's alone
    assert set(env) == set(original.hosts)
    files = {h: env[h]["HOTSPARE_FAKE_NVML"] for h in env}
    assert len(set(files.values())) == 3
    data = json.loads(Path(files["local-a"]).read_text())
    data["devices"][0]["ecc_uncorrected"] = 2
    Path(files["local-a"]).write_text(json.dumps(data))
    demo_setup.setup(short_tmp, state)  # kept, not rewritten
    a = health(files["local-a"], short_tmp / "wa")
    b = health(files["local-b"], short_tmp / "wb")
    assert [g["ecc_uncorrected"] for g in a["gpus"]] == [2, 0]
    assert [g["ecc_uncorrected"] for g in b["gpus"]] == [0, 0]


def test_a_file_that_is_not_the_shipped_demo_is_refused(short_tmp: Path) -> None:
    shipped = short_tmp / "inventory.toml"
    text = (
        (REPO / "inventory.toml").read_text().replace('state_dir = ".hotspare"', 'state_dir = "st"')
    )
    shipped.write_text(text)
    with pytest.raises(SystemExit, match="not the shipped demo file"):
        demo_setup.setup(short_tmp, short_tmp / ".hotspare")
    assert not (short_tmp / ".hotspare" / "inventory.toml").exists()
