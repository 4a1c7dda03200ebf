"""The policy asked for is the policy run, in every order of arguments (issue 29).

``hotspare --policy observe run`` ran under ``auto``: the ``run`` subcommand's own default
overwrote the option given before it. These run the real command and read what the controller
it built journals at start (``console started (policy X)``)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from support.fleetbed import local_host, write_inventory

from console.cli import main
from console.controller import Controller
from console.records.console_lock import held
from console.records.journal import Kind, read


@pytest.fixture
def inventory(tmp_path: Path) -> Path:
    """One local host and no job: ``hotspare run`` starts its controller and ends at once."""
    return write_inventory(
        tmp_path / "inventory.toml", hosts={"a": local_host(tmp_path / "a")}, jobs={}
    )


def started_under(inventory: Path) -> list[str]:
    """The policy of every console start the journal holds, in order."""
    journal = inventory.parent / "state" / "journal.jsonl"
    return [
        e.data["policy"] for e in read(journal) if e.kind == Kind.CONSOLE and "policy" in e.data
    ]


@pytest.mark.parametrize(
    ("spelling", "policy"),
    [
        (["run"], "auto"),
        (["--policy", "observe", "run"], "observe"),
        (["--policy", "manual", "run"], "manual"),
        (["--policy=observe", "run"], "observe"),
        (["run", "--policy", "observe"], "observe"),
        (["run", "--policy", "manual"], "manual"),
        (["run", "--policy=observe"], "observe"),
        (["--policy", "observe", "run", "--policy", "observe"], "observe"),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else v,
)
def test_run_runs_under_the_policy_asked_for(
    inventory: Path, capsys: pytest.CaptureFixture[str], spelling: list[str], policy: str
) -> None:
    assert main(["--inventory", str(inventory), *spelling]) == 0
    out = capsys.readouterr().out
    assert f"console started (policy {policy})" in out
    assert started_under(inventory) == [policy]


@pytest.mark.parametrize(
    "spelling",
    [
        ["--policy", "observe", "run", "--policy", "auto"],
        ["--policy", "auto", "run", "--policy", "manual"],
    ],
    ids=" ".join,
)
def test_run_refuses_two_policies_that_disagree(
    inventory: Path, capsys: pytest.CaptureFixture[str], spelling: list[str]
) -> None:
    assert main(["--inventory", str(inventory), *spelling]) == 2
    out, err = capsys.readouterr()
    before, after = spelling[1], spelling[4]
    assert err == (
        f"hotspare: --policy {before} before `run` and --policy {after} after it disagree;"
        " give one\n"
    )
    assert out == ""
    assert started_under(inventory) == [], "nothing started"


@pytest.mark.parametrize(
    ("spelling", "policy"),
    [([], "manual"), (["--policy", "observe"], "observe"), (["--policy", "auto"], "auto")],
    ids=lambda v: " ".join(v) if isinstance(v, list) else v,
)
def test_the_console_runs_under_the_policy_asked_for(
    inventory: Path, monkeypatch: pytest.MonkeyPatch, spelling: list[str], policy: str
) -> None:
    from console.ui.app import HotspareApp

    built: list[Controller] = []
    monkeypatch.setattr(HotspareApp, "run", lambda app, *a, **k: built.append(app.ctl))
    try:
        assert main(["--inventory", str(inventory), *spelling]) == 0
        assert [c.policy.value for c in built] == [policy]
        built[0].lock.release()
    finally:  # the view started a controller detached: it outlived the test (and the suite)
        if held(inventory.parent / "state"):
            assert main(["--inventory", str(inventory), "stop"]) == 0
        deadline = time.monotonic() + 30
        while held(inventory.parent / "state"):
            assert time.monotonic() < deadline, "the detached controller did not stop"
            time.sleep(0.05)
