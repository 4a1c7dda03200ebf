"""``hotspare`` with bad input: ``check --json`` still answers on stdout, ``report`` still
reports (it reads only the journal), and ``--help`` says what the policies default to."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from support.helpers import REPO

import executors
from console.cli import main
from console.records.journal import Journal, Kind
from protocol.version import source_hash

TYPO = '[console]\nstate_dir = "state"\nheartbeat_sx = 1.0\n'
"""An inventory with a misspelt key: valid TOML, refused by the loader."""


def journal_with_an_incident(state_dir: Path) -> None:
    j = Journal(state_dir / "journal.jsonl")
    j.record(
        Kind.INCIDENT,
        "incident 1: j on a: host_lost: gone",
        job="j",
        host="a",
        incident=1,
        data={"phase": "detected", "class": "host_lost", "fault_at": 1.0, "last_step": 7},
    )


def test_check_json_with_a_bad_inventory_prints_the_error_as_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inventory = tmp_path / "inventory.toml"
    inventory.write_text(TYPO)
    assert main(["--inventory", str(inventory), "check", "--json"]) == 2
    out, err = capsys.readouterr()
    answer = json.loads(out)
    assert sorted(answer) == ["error", "hosts", "ok"], "the same shape as on success"
    assert (answer["ok"], answer["hosts"]) == (False, [])
    assert "heartbeat_sx" in answer["error"] and str(inventory) in answer["error"]
    assert err.strip() == f"hotspare: {answer['error']}", "stderr says it too, once"


def test_check_without_json_keeps_stdout_empty_on_a_bad_inventory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--inventory", str(tmp_path / "missing.toml"), "check"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "no such file" in err


@pytest.mark.parametrize(
    ("text", "state"),
    [(TYPO, "state"), ("[console\nstate_dir = 'state'\n", ".hotspare")],
    ids=["misspelt key: the state dir it names", "not TOML: the default state dir"],
)
def test_report_with_a_bad_inventory_reads_the_state_dir_all_the_same(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, state: str
) -> None:
    inventory = tmp_path / "inventory.toml"
    inventory.write_text(text)
    journal_with_an_incident(tmp_path / state)
    assert main(["--inventory", str(inventory), "report"]) == 0
    out, err = capsys.readouterr()
    assert "## Incident 1: j on a (host_lost)" in out
    first, second = err.splitlines()
    assert first.startswith(f"hotspare: {inventory}")
    assert second.startswith(f"hotspare: reporting on {tmp_path / state} all the same")


def test_report_with_a_state_dir_ignores_a_bad_inventory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inventory = tmp_path / "inventory.toml"
    inventory.write_text(TYPO)
    journal_with_an_incident(tmp_path / "elsewhere")
    argv = ["--inventory", str(inventory), "report", "--state-dir", str(tmp_path / "elsewhere")]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert "## Incident 1: j on a" in out and err == ""


@pytest.mark.parametrize(
    ("argv", "default"), [([], "manual"), (["run"], "auto")], ids=["console", "run"]
)
def test_help_shows_the_default_policy(
    capsys: pytest.CaptureFixture[str], argv: list[str], default: str
) -> None:
    with pytest.raises(SystemExit) as done:
        main([*argv, "--help"])
    assert done.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps to the terminal
    assert f"(default: {default}" in text


def test_version_names_the_release_and_the_bundle_both_commands_deploy(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--version`` on both commands: the release and the executor bundle's hash, the one the
    console deploys under and every manifest records (worked out here from the files)."""
    bundle = source_hash(REPO)
    with pytest.raises(SystemExit) as ended:
        main(["--version"])
    assert ended.value.code == 0
    assert capsys.readouterr().out == f"hotspare {metadata.version('hotspare')}+{bundle}\n"
    executor = subprocess.run(
        [sys.executable, "-m", "executors.cli", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        check=True,
    )
    assert executor.stdout == f"hotspare-executor {executors.__version__}+{bundle}\n"


def test_asyncssh_s_dsa_deprecation_never_reaches_a_commands_stderr() -> None:
    """cryptography 51 (released while this suite ran) warns 'DSA is deprecated' as asyncssh
    imports: every hotspare command printed it on stderr, breaking the one-line error of bad
    input (six tests of a fresh clone failed). Raised here as asyncssh raises it, whatever
    cryptography is installed: not shown once console is imported; other warnings still are."""
    code = (
        "import warnings, console\n"
        "warnings.warn_explicit('DSA is deprecated and support will be removed', "
        "DeprecationWarning, 'misc.py', 32, module='asyncssh.crypto.misc')\n"
        "warnings.warn_explicit('something else', DeprecationWarning, 'x.py', 1, module='other')\n"
    )
    done = subprocess.run(
        [sys.executable, "-W", "default", "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "DSA" not in done.stderr
    assert "something else" in done.stderr, "only that one warning is hidden"
