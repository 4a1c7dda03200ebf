"""``hotspare check`` and ``hotspare run`` check the jobs too (issue 29): a misspelt workload
(``charml``) or an unknown config key (``nlayer``) is one line naming the file, key path and
line, with a did-you-mean, exit 2, before any host is reached. Before, both passed ``check``
and failed on the host some 10 s into ``run``."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
from support.helpers import REPO

from console.cli import main
from console.inventory import load
from protocol.errors import ConfigError

SHIPPED = (REPO / "inventory.toml").read_text(encoding="utf-8")


def shipped_with(tmp_path: Path, old: str, new: str) -> tuple[Path, int]:
    """The shipped inventory with one line changed; its path and the changed line's number."""
    assert SHIPPED.count(f"\n{old}") == 1, old
    text = SHIPPED.replace(f"\n{old}", f"\n{new}")
    path = tmp_path / "inventory.toml"
    path.write_text(text, encoding="utf-8")
    return path, text[: text.index(f"\n{new}")].count("\n") + 2


CASES = {
    "misspelt workload": (
        'workload = "charlm"',
        'workload = "charml"',
        "jobs.demo.workload: unknown workload 'charml' (did you mean 'charlm'?); built in:"
        " charlm, or give 'module:factory'",
    ),
    "unknown config key": (
        "n_layer = 2",
        "nlayer = 2",
        "jobs.demo.config.nlayer: unknown key `nlayer` (did you mean `n_layer`?)",
    ),
    "config value of the wrong type": (
        "n_layer = 2",
        'n_layer = "two"',
        "jobs.demo.config.n_layer: Expected `int`, got `str`",
    ),
    "config the workload cannot build": (
        "n_embd = 64",
        "n_embd = 66",
        "jobs.demo.config: n_embd 66 is not a multiple of n_head 4",
    ),
}


@pytest.mark.parametrize("command", ["check", "run"])
@pytest.mark.parametrize("case", list(CASES))
def test_a_bad_job_is_one_line_and_exit_2_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, case: str
) -> None:
    old, new, what = CASES[case]
    inventory, line = shipped_with(tmp_path, old, new)
    assert main(["--inventory", str(inventory), command]) == 2
    out, err = capsys.readouterr()
    where = (
        line
        if case != "config the workload cannot build"
        else SHIPPED.count("\n", 0, SHIPPED.index("[jobs.demo.config]")) + 1
    )
    assert err == f"hotspare: {inventory}:{where}: {what}\n"
    assert out == ""
    assert not (tmp_path / ".hotspare" / "journal.jsonl").exists(), "no console started"
    assert not (tmp_path / ".hotspare" / "hosts").exists(), "no host was set up"


def test_check_json_says_the_bad_job_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inventory, line = shipped_with(tmp_path, 'workload = "charlm"', 'workload = "charml"')
    assert main(["--inventory", str(inventory), "check", "--json"]) == 2
    out, _ = capsys.readouterr()
    error = msgspec.json.decode(out)["error"]
    assert error.startswith(f"{inventory}:{line}: jobs.demo.workload: unknown workload 'charml'")


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ('workload = "charlm"', 'workload = "my_models:build"'),
        ('executor = "torch"', 'executor = "my_kind"'),
    ],
    ids=["module:factory is the host's to resolve", "a plug-in kind's config is its own"],
)
def test_what_only_the_host_can_know_is_left_to_it(short_tmp: Path, old: str, new: str) -> None:
    inventory, _ = shipped_with(short_tmp, old, new)
    text = inventory.read_text().replace("\nn_layer = 2", "\nnlayer = 2")
    inventory.write_text(text)
    assert "demo" in load(inventory).jobs


def test_a_workload_name_with_no_factory_is_refused(tmp_path: Path) -> None:
    inventory, line = shipped_with(tmp_path, 'workload = "charlm"', 'workload = "mod:"')
    with pytest.raises(ConfigError) as e:
        load(inventory)
    assert str(e.value).startswith(f"{inventory}:{line}: jobs.demo.workload: unknown workload")


def test_the_console_knows_the_workloads_the_executor_builds() -> None:
    """protocol/workloads.py is what the console checks against: the same names and, field
    for field, the same config schema as the executor's workloads (a drift fails here)."""
    from executors.kinds.torch.workload import BUILTIN
    from executors.kinds.torch.workloads.charlm import CharLMConfig
    from protocol.workloads import BUILTIN_WORKLOADS

    assert set(BUILTIN_WORKLOADS) == set(BUILTIN)

    def schema(tp: type) -> list[tuple[str, object, object]]:
        return [(f.name, f.type, f.default) for f in msgspec.structs.fields(tp)]

    assert schema(BUILTIN_WORKLOADS["charlm"]) == schema(CharLMConfig)
