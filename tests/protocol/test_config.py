"""Job spec files: good ones load, bad ones are one clear line naming file, line and key path."""

from __future__ import annotations

import tomllib
from pathlib import Path

import msgspec
import pytest

from executors.agent.spec import load_spec
from protocol.config import convert, find_line, read_toml
from protocol.errors import ConfigError
from protocol.spec import JobSpec

GOOD_SPEC = """\
# a standalone job spec
name = "charlm-small"
executor = "torch"
workload = "charlm"
steps = 80
seed = 7
checkpoint_every_steps = 10
checkpoint_every_s = 12.5
keep_checkpoints = 3

[config]
n_layer = 2
lr = 0.003
betas = [0.9, 0.95]
data = { corpus = "tiny.txt", block = 32 }
"""

INVENTORY = """\
[hosts.gpu-a]
address = "127.0.0.2"
region = "eu-west"

[hosts.gpu-b]
address = "127.0.0.3"
region = "eu-west"

[jobs.demo]
host = "gpu-a"
spares = ["gpu-b"]
region = "eu-west"
priority = 10
workload = "charlm"
steps = 40
checkpoint_every_steps = 5

[jobs.demo.config]
n_layer = 1
data.corpus = "builtin"

[jobs."other.job_2"]
host = "gpu-b"
steps = 7
"""


def write(tmp_path: Path, text: str | bytes, name: str = "job.toml") -> Path:
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


# ------------------------------------------------------------------------ good files


def test_standalone_spec_loads(tmp_path: Path) -> None:
    spec = load_spec(write(tmp_path, GOOD_SPEC))
    assert spec == JobSpec(
        name="charlm-small",
        executor="torch",
        workload="charlm",
        steps=80,
        seed=7,
        checkpoint_every_steps=10,
        checkpoint_every_s=12.5,
        keep_checkpoints=3,
        config={
            "n_layer": 2,
            "lr": 0.003,
            "betas": [0.9, 0.95],
            "data": {"corpus": "tiny.txt", "block": 32},
        },
    )
    # naming the job it holds is fine too
    assert load_spec(tmp_path / "job.toml", "charlm-small") == spec


def test_minimal_spec_takes_the_defaults(tmp_path: Path) -> None:
    spec = load_spec(write(tmp_path, 'name = "m"\nsteps = 1\n'))
    assert (spec.executor, spec.workload, spec.seed, spec.keep_checkpoints) == (
        "torch",
        "charlm",
        0,
        3,
    )
    assert spec.checkpoint_every_steps is None
    assert spec.checkpoint_every_s is None
    assert spec.config == {}


def test_inventory_job_drops_placement_keys(tmp_path: Path) -> None:
    path = write(tmp_path, INVENTORY, "inventory.toml")
    spec = load_spec(path, "demo")
    assert spec == JobSpec(
        name="demo",
        workload="charlm",
        steps=40,
        checkpoint_every_steps=5,
        config={"n_layer": 1, "data": {"corpus": "builtin"}},
    )
    other = load_spec(path, "other.job_2")
    assert (other.name, other.steps, other.config) == ("other.job_2", 7, {})


def test_inventory_with_one_job_needs_no_choice(tmp_path: Path) -> None:
    text = '[jobs.solo]\nhost = "h"\nspares = []\nregion = "r"\npriority = 1\nsteps = 3\n'
    spec = load_spec(write(tmp_path, text))
    assert (spec.name, spec.steps) == ("solo", 3)


def test_state_hash_ignores_steps_and_cadence_but_not_config(tmp_path: Path) -> None:
    a = load_spec(write(tmp_path, GOOD_SPEC, "a.toml"))
    b = load_spec(write(tmp_path, GOOD_SPEC.replace("steps = 80", "steps = 800"), "b.toml"))
    c = load_spec(write(tmp_path, GOOD_SPEC.replace("n_layer = 2", "n_layer = 3"), "c.toml"))
    assert a.state_hash() == b.state_hash()
    assert a.state_hash() != c.state_hash()


# ------------------------------------------------------------------------ bad files

BAD = [
    # (id, file contents, job argument, substrings; {p} is the file's path)
    (
        "toml-syntax",
        'name = "a"\nsteps = 10\nseed = = 3\n',
        None,
        ["{p}:3: TOML syntax error: Invalid value (column 8)"],
    ),
    (
        "toml-duplicate-key",
        'name = "a"\nsteps = 1\n\nsteps = 2\n',
        None,
        ["{p}:4: TOML syntax error: Cannot overwrite a value"],
    ),
    (
        "toml-unterminated-at-end",
        'name = "a"\nsteps = 1\nworkload = "charlm',
        None,
        ["{p}:3: TOML syntax error: Unterminated string"],
    ),
    (
        "wrong-type",
        'name = "a"\nsteps = "ten"\n',
        None,
        ["{p}:2: steps: Expected `int`, got `str`"],
    ),
    (
        "bool-is-not-int",
        'name = "a"\n\nsteps = true\n',
        None,
        ["{p}:3: steps: Expected `int`, got `bool`"],
    ),
    (
        "negative-steps",
        'name = "a"\nsteps = -5\n',
        None,
        ["{p}:2: steps: Expected `int` >= 1, got -5"],
    ),
    (
        "zero-keep-checkpoints",
        'name = "a"\nsteps = 5\nkeep_checkpoints = 0\n',
        None,
        ["{p}:3: keep_checkpoints: Expected `int` >= 1, got 0"],
    ),
    (
        "zero-checkpoint-seconds",
        'name = "a"\nsteps = 5\ncheckpoint_every_s = 0.0\n',
        None,
        ["{p}:3: checkpoint_every_s: Expected `float` > 0.0, got 0.0"],
    ),
    (
        "name-with-slash",
        'name = "../etc"\nsteps = 5\n',
        None,
        ["{p}:1: name: a job name is 1 to 64 letters, digits", "got '../etc'"],
    ),
    (
        "name-with-shell-metacharacters",
        'steps = 5\nname = "x; rm -rf ~"\n',
        None,
        ["{p}:2: name: a job name is", "got 'x; rm -rf ~'"],
    ),
    (
        "name-too-long",
        f'name = "{"n" * 65}"\nsteps = 5\n',
        None,
        ["{p}:1: name: a job name is 1 to 64"],
    ),
    (
        "inventory-job-name-with-slash",
        '[hosts.a]\n\n[jobs."a/b"]\nhost = "a"\nsteps = 3\n',
        None,
        ['{p}:3: jobs."a/b"', "a job name is", "got 'a/b'"],
    ),
    (
        "inventory-job-name-with-shell",
        '[jobs."x$(reboot)"]\nsteps = 3\n',
        "x$(reboot)",
        ['{p}:1: jobs."x$(reboot)"', "got 'x$(reboot)'"],
    ),
    (
        "unknown-key-did-you-mean",
        'name = "a"\nstepz = 5\n',
        None,
        ["{p}:2: stepz: unknown key `stepz` (did you mean `steps`?)"],
    ),
    (
        "unknown-key-no-guess",
        'name = "a"\nsteps = 5\ncolour = "blue"\n',
        None,
        ["{p}:3: colour: unknown key `colour`"],
    ),
    (
        "placement-key-in-standalone-spec",
        'name = "a"\nsteps = 5\nhost = "gpu-a"\n',
        None,
        ["{p}:3: host: unknown key `host`"],
    ),
    (
        "unknown-key-in-inventory-job",
        '[hosts.a]\nregion = "r"\n\n[jobs.demo]\nhost = "a"\nsteps = 5\nseeed = 3\n',
        None,
        ["{p}:7: jobs.demo.seeed: unknown key `seeed` (did you mean `seed`?)"],
    ),
    (
        "unknown-key-with-newline",
        'name = "a"\nsteps = 1\n"st\\neps" = 2\n',
        None,
        ['{p}:3: "st\\neps": unknown key `st\\neps`'],
    ),
    (
        "missing-steps",
        'name = "a"\nseed = 1\n',
        None,
        ["{p}: (top level): Object missing required field `steps`"],
    ),
    (
        "missing-steps-in-inventory-job",
        '[hosts.a]\n\n[jobs.demo]\nhost = "a"\nseed = 3\n',
        None,
        ["{p}:3: jobs.demo: Object missing required field `steps`"],
    ),
    (
        "wrong-type-in-inventory-job",
        '[jobs.demo]\nhost = "a"\nsteps = "x"\n',
        None,
        ["{p}:3: jobs.demo.steps: Expected `int`, got `str`"],
    ),
    (
        "wrong-type-dotted-keys-second-job",
        'jobs.a.steps = 1\njobs.b.steps = "x"\n',
        "b",
        ["{p}:2: jobs.b.steps: Expected `int`, got `str`"],
    ),
    (
        "wrong-value-in-inline-table",
        "jobs = { demo = { steps = 0 } }\n",
        None,
        ["{p}:1: jobs.demo.steps: Expected `int` >= 1, got 0"],
    ),
    (
        "config-not-a-table",
        'name = "a"\nsteps = 3\nconfig = 5\n',
        None,
        ["{p}:3: config: Expected `object`, got `int`"],
    ),
    (
        "several-jobs-none-chosen",
        "[jobs.a]\nsteps = 1\n[jobs.b]\nsteps = 2\n",
        None,
        ["{p}: several jobs (a, b); choose one with --job"],
    ),
    (
        "job-does-not-exist",
        "[jobs.a]\nsteps = 1\n[jobs.b]\nsteps = 2\n",
        "c",
        ["{p}", "jobs.c: no such job (have: a, b)"],
    ),
    (
        "standalone-spec-for-another-job",
        'name = "a"\nsteps = 1\n',
        "b",
        ["{p}", "name: the spec is for job 'a', not 'b'"],
    ),
    (
        "jobs-not-a-table",
        "jobs = 3\n",
        None,
        ["{p}", "jobs: expected at least one [jobs.NAME] table"],
    ),
    (
        "jobs-empty",
        "[jobs]\n",
        None,
        ["{p}", "jobs: expected at least one [jobs.NAME] table"],
    ),
    (
        "job-not-a-table",
        "[jobs]\ndemo = 3\n",
        None,
        ["{p}", "jobs.demo: expected a table"],
    ),
    ("empty-file", "", None, ["{p}", "missing required field `name`"]),
    (
        "not-utf8",
        b'name = "a"\nworkload = "\xff\xfe"\nsteps = 1\n',
        None,
        ["{p}:2: not UTF-8 text: byte 0xff at column 13"],
    ),
]


@pytest.mark.parametrize(("text", "job", "wants"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_file_is_one_clear_line(
    tmp_path: Path, text: str | bytes, job: str | None, wants: list[str]
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as e:
        load_spec(path, job)
    msg = str(e.value)
    assert "\n" not in msg
    assert "\r" not in msg
    assert msg.startswith(str(path))
    for want in wants:
        assert want.format(p=path) in msg, msg
    assert e.value.__cause__ is None  # no chained traceback for a person's mistake


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.toml"
    with pytest.raises(ConfigError) as e:
        load_spec(path)
    assert str(e.value) == f"{path}: no such file"


def test_directory_instead_of_a_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as e:
        load_spec(tmp_path)
    assert str(e.value) == f"{tmp_path}: is a directory, not a TOML file"


def test_read_toml_returns_the_text(tmp_path: Path) -> None:
    data, text = read_toml(write(tmp_path, GOOD_SPEC))
    assert text == GOOD_SPEC
    assert data["config"]["data"] == {"corpus": "tiny.txt", "block": 32}


def test_convert_names_prefix_and_line_without_a_file_on_disk() -> None:
    text = "[jobs.demo]\nsteps = 1\nkeep_checkpoints = -1\n"
    data = {"name": "demo", "steps": 1, "keep_checkpoints": -1}
    with pytest.raises(ConfigError) as e:
        convert(data, JobSpec, file=Path("inv.toml"), text=text, prefix=["jobs", "demo"])
    assert str(e.value) == "inv.toml:3: jobs.demo.keep_checkpoints: Expected `int` >= 1, got -1"


def test_convert_unknown_key_in_a_nested_struct() -> None:
    class Outer(msgspec.Struct, forbid_unknown_fields=True):
        spec: JobSpec

    text = '[spec]\nname = "a"\nsteps = 1\nkeep_checkpoint = 2\n'
    data = {"spec": {"name": "a", "steps": 1, "keep_checkpoint": 2}}
    with pytest.raises(ConfigError) as e:
        convert(data, Outer, file=Path("o.toml"), text=text)
    assert str(e.value) == (
        "o.toml:4: spec.keep_checkpoint: unknown key `keep_checkpoint`"
        " (did you mean `keep_checkpoints`?)"
    )


# ------------------------------------------------------------------------ find_line

LAYOUT_TABLES = """\
# comment
[jobs.a]
steps = 1
seed = 2

[jobs.a.config]
lr = 0.1
opt.beta = 0.9

[jobs.b]
steps = 3
  seed=4   # indented, no spaces
"""

LAYOUT_DOTTED = """\
name = "x"
jobs.a.steps = 1
jobs.b.steps = 2
jobs . b . seed = 5
config.lr = 1
config.lr2 = 2
"""

LAYOUT_QUOTED_AND_ARRAYS = """\
[jobs."a/b"]
steps = 1
'lit.key' = 2

[[hosts]]
name = "h0"

[[hosts]]
name = "h1"
port = 22

[[hosts.disks]]
size = 1

[[hosts.disks]]
size = 2

[tail]
steps = 3
"""

LAYOUT_MULTILINE_STRING = """\
doc = \"\"\"
steps = 99
[not.a.table]
\"\"\"
steps = 3
"""


LAYOUT_NAMES = {
    LAYOUT_TABLES: "tables",
    LAYOUT_DOTTED: "dotted",
    LAYOUT_QUOTED_AND_ARRAYS: "quoted+arrays",
    LAYOUT_MULTILINE_STRING: "multiline-string",
}

FIND_LINE_CASES = [
    (LAYOUT_TABLES, ["jobs", "a"], 2),
    (LAYOUT_TABLES, ["jobs", "a", "seed"], 4),
    (LAYOUT_TABLES, ["jobs", "a", "config"], 6),
    (LAYOUT_TABLES, ["jobs", "a", "config", "lr"], 7),
    (LAYOUT_TABLES, ["jobs", "a", "config", "opt", "beta"], 8),
    (LAYOUT_TABLES, ["jobs", "b", "steps"], 11),
    (LAYOUT_TABLES, ["jobs", "b", "seed"], 12),
    # a key that is not there: the table it belongs in
    (LAYOUT_TABLES, ["jobs", "b", "keep_checkpoints"], 10),
    (LAYOUT_TABLES, ["jobs"], 2),
    (LAYOUT_TABLES, ["hosts"], None),
    (LAYOUT_TABLES, [], None),
    (LAYOUT_DOTTED, ["name"], 1),
    (LAYOUT_DOTTED, ["jobs", "a", "steps"], 2),
    (LAYOUT_DOTTED, ["jobs", "b", "steps"], 3),
    (LAYOUT_DOTTED, ["jobs", "b", "seed"], 4),
    (LAYOUT_DOTTED, ["jobs", "b"], 3),
    (LAYOUT_DOTTED, ["config", "lr2"], 6),
    (LAYOUT_QUOTED_AND_ARRAYS, ["jobs", "a/b", "steps"], 2),
    (LAYOUT_QUOTED_AND_ARRAYS, ["jobs", "a/b", "lit.key"], 3),
    (LAYOUT_QUOTED_AND_ARRAYS, ["jobs", "a/b", "name"], 1),
    (LAYOUT_QUOTED_AND_ARRAYS, ["hosts", "0", "name"], 6),
    (LAYOUT_QUOTED_AND_ARRAYS, ["hosts", "1", "name"], 9),
    (LAYOUT_QUOTED_AND_ARRAYS, ["hosts", "1", "port"], 10),
    (LAYOUT_QUOTED_AND_ARRAYS, ["hosts", "1", "disks", "1", "size"], 16),
    (LAYOUT_QUOTED_AND_ARRAYS, ["tail", "steps"], 19),
    # text inside a multi-line string is not a key
    (LAYOUT_MULTILINE_STRING, ["steps"], 5),
    (LAYOUT_MULTILINE_STRING, ["not", "a", "table"], None),
]


@pytest.mark.parametrize(
    ("text", "keys", "line"),
    FIND_LINE_CASES,
    ids=[f"{LAYOUT_NAMES[t]}-{'.'.join(k) or 'none'}" for t, k, _ in FIND_LINE_CASES],
)
def test_find_line(text: str, keys: list[str], line: int | None) -> None:
    assert find_line(text, keys) == line


def test_find_line_layouts_are_valid_toml() -> None:
    for text in (
        LAYOUT_TABLES,
        LAYOUT_DOTTED,
        LAYOUT_QUOTED_AND_ARRAYS,
        LAYOUT_MULTILINE_STRING,
    ):
        tomllib.loads(text)
