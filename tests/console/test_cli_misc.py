"""``hotspare`` with bad input: ``check --json`` still answers on stdout."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from console.cli import main

TYPO = '[console]\nstate_dir = "state"\nheartbeat_sx = 1.0\n'
"""An inventory with a misspelt key: valid TOML, refused by the loader."""


def test_check_json_with_a_bad_inventory_prints_the_error_as_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inventory = tmp_path / "inventory.toml"
    inventory.write_text(TYPO)
    assert main(["--inventory", str(inventory), "check", "--json"]) == 2
    out, err = capsys.readouterr()
    answer = json.loads(out)
    assert answer["ok"] is False
    assert "heartbeat_sx" in answer["error"] and str(inventory) in answer["error"]
    assert err.strip() == f"hotspare: {answer['error']}", "stderr says it too, once"


def test_check_without_json_keeps_stdout_empty_on_a_bad_inventory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--inventory", str(tmp_path / "missing.toml"), "check"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "no such file" in err
