"""Layouts by framework name (``[command] layout``): each stands for the keys its framework's
checkpoints need, a key in the table wins, a misspelt one is one line with a guess, and each
layout's rules match what the framework really writes and prints (file names, log lines)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from support.fleetbed import local_host, write_inventory
from support.helpers import REPO, env_with

from console.inventory import load
from executors.kinds.command.command_files import Watcher
from protocol.errors import ConfigError
from protocol.layouts import LAYOUTS
from protocol.spec import CommandSpec


def inventory(tmp_path: Path, command: dict[str, object]) -> Path:
    return write_inventory(
        tmp_path / "inventory.toml",
        hosts={"a": local_host(tmp_path / "a")},
        jobs={"j": {"host": "a", "executor": "command", "steps": 10, "command": command}},
    )


def spec(tmp_path: Path, **command: object) -> CommandSpec:
    cs = load(inventory(tmp_path, {"argv": ["python", "train.py"], **command})).jobs["j"].spec
    assert cs.command is not None
    return cs.command


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_each_layout_is_a_valid_command_table_with_its_keys(tmp_path: Path, name: str) -> None:
    cs = spec(tmp_path, layout=name)
    assert cs.layout == name
    for key, value in LAYOUTS[name].keys.items():
        assert getattr(cs, key) == value, key


def test_a_key_in_the_table_wins_over_the_layout(tmp_path: Path) -> None:
    cs = spec(tmp_path, layout="lightning", checkpoint_glob="model-*.ckpt")
    assert cs.checkpoint_glob == "model-*.ckpt"
    assert cs.step_regex == LAYOUTS["lightning"].keys["step_regex"]
    cs = spec(tmp_path, layout="nanogpt", checkpoint_file="model.pt")
    assert (cs.checkpoint_file, cs.resume_argv) == ("model.pt", ["--init_from=resume"])


def test_a_misspelt_layout_is_one_line_naming_the_line_and_a_guess(tmp_path: Path) -> None:
    path = inventory(tmp_path, {"argv": ["python", "train.py"], "layout": "lightnin"})
    with pytest.raises(ConfigError) as e:
        load(path)
    text = str(e.value)
    assert "\n" not in text
    line = next(i for i, s in enumerate(path.read_text().splitlines(), 1) if "lightnin" in s)
    assert text.startswith(f"{path}:{line}: jobs.j.command.layout: 'lightnin' is not a layout")
    assert "did you mean 'lightning'?" in text
    check = subprocess.run(
        [sys.executable, "-m", "console.cli", "--inventory", str(path), "check"],
        capture_output=True, text=True, env=env_with(), cwd=REPO, timeout=60,
    )  # fmt: skip
    assert check.returncode == 2, check
    assert "Traceback" not in check.stderr
    assert "'lightnin' is not a layout" in check.stderr


def test_a_layout_of_the_wrong_type_is_refused_too(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="3 is not a layout"):
        load(inventory(tmp_path, {"argv": ["python", "train.py"], "layout": 3}))


def files(tmp_path: Path, cs: CommandSpec, names: list[str], folders: bool = False) -> list:
    """What a Watcher with ``cs`` takes of a folder holding ``names``, and what it warns."""
    folder = tmp_path / "ckpt"
    folder.mkdir()
    for n in names:
        p = folder / n
        if folders:
            p.mkdir()
            (p / "model.safetensors").write_bytes(b"x")
        else:
            p.write_bytes(b"x")
    warned: list[str] = []
    found = Watcher(folder, cs, warn=warned.append).files()
    return [(p.name, step) for p, step in found] + [("warned", w) for w in warned]


def test_lightning_takes_its_step_files_and_leaves_last_ckpt_alone(tmp_path: Path) -> None:
    cs = spec(tmp_path, layout="lightning")
    names = ["epoch=0-step=50.ckpt", "epoch=1-step=100.ckpt", "last.ckpt", "last-v1.ckpt"]
    assert files(tmp_path, cs, names) == [
        ("epoch=0-step=50.ckpt", 50),
        ("epoch=1-step=100.ckpt", 100),
    ]


def test_hf_trainer_takes_checkpoint_folders_by_their_number(tmp_path: Path) -> None:
    cs = spec(tmp_path, layout="hf_trainer")
    got = files(tmp_path, cs, ["checkpoint-500", "checkpoint-1000", "runs"], folders=True)
    assert got == [("checkpoint-1000", 1000), ("checkpoint-500", 500)]


def test_torchtitan_takes_step_folders(tmp_path: Path) -> None:
    cs = spec(tmp_path, layout="torchtitan")
    got = files(tmp_path, cs, ["step-10", "step-20"], folders=True)
    assert got == [("step-10", 10), ("step-20", 20)]
    assert cs.complete_marker == ".metadata"


@pytest.mark.parametrize(
    ("name", "line", "step", "loss"),
    [
        # nanoGPT's train.py: print(f"iter {iter_num}: loss {lossf:.4f}, time ..., mfu ...")
        ("nanogpt", "iter 120: loss 2.3456, time 35.12ms, mfu 12.34%", 120, "2.3456"),
        # torchtitan's train.py logs in colour: escape codes between the fields
        (
            "torchtitan",
            "\x1b[31mstep: 10  \x1b[32mloss:  7.9345  \x1b[33mmemory: 1.23GiB(3.1%)  "
            "\x1b[34mtps: 1,234  \x1b[35mtflops: 12.3  \x1b[35mmfu: 4.5%\x1b[39m",
            10,
            "7.9345",
        ),
    ],
)
def test_the_progress_rule_reads_the_frameworks_own_log_line(
    name: str, line: str, step: int, loss: str
) -> None:
    m = re.search(LAYOUTS[name].keys["progress_regex"], line)
    assert m is not None and int(m.group("step")) == step and m.group("loss") == loss
    # and nanoGPT's evaluation line is not taken for a training step's loss
    assert (
        re.search(
            LAYOUTS["nanogpt"].keys["progress_regex"], "step 120: train loss 2.1, val loss 2.2"
        )
        is None
    )


def test_the_docs_list_every_layout() -> None:
    text = (REPO / "docs" / "command.md").read_text()
    for name in LAYOUTS:
        assert f"| `{name}` |" in text, name
