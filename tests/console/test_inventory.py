"""The inventory: the shipped default, malformed files (one line, exit 2), appends, hostile values."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import tomli_w
from support.helpers import REPO, env_with, wait_for

from console.inventory import Inventory, append_host, load, remove_host
from console.reach.deploy import build_bundle, bundle_dir, deploy
from console.reach.preflight import preflight
from console.reach.transport.local import LocalTransport
from protocol.errors import ConfigError
from protocol.spec import JobSpec

SHIPPED = REPO / "inventory.toml"


def cli(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "console.cli", *args],
        cwd=cwd,
        env=env_with(),
        capture_output=True,
        text=True,
        timeout=120,
    )


# --- the shipped inventory -------------------------------------------------------------------


def test_the_shipped_inventory_loads() -> None:
    inv = load(SHIPPED)
    assert set(inv.regions) == {"us-east", "eu-west"}
    assert set(inv.hosts) == {"local-a", "local-b", "local-c"}
    assert all(h.transport == "local" for h in inv.hosts.values())
    assert {h.region for h in inv.hosts.values()} == set(inv.regions)
    assert inv.hosts["local-a"].region == "us-east"
    assert inv.hosts["local-c"].region == "eu-west"
    assert inv.regions["us-east"].priority < inv.regions["eu-west"].priority

    assert list(inv.jobs) == ["demo"]
    demo = inv.jobs["demo"]
    assert demo.name == "demo"
    assert demo.placement.host in inv.hosts
    assert demo.placement.spares
    assert set(demo.placement.spares) <= set(inv.hosts)
    assert demo.placement.host not in demo.placement.spares
    spec = demo.spec
    assert isinstance(spec, JobSpec)
    assert (spec.name, spec.executor, spec.workload) == ("demo", "torch", "charlm")
    # minutes of training, not 18 s: a newcomer finds the kill key before the demo ends
    assert (spec.steps, spec.seed, spec.checkpoint_every_steps, spec.keep_checkpoints) == (
        20000,
        1,
        50,
        3,
    )
    assert spec.config["n_layer"] == 2
    assert spec.config["lr"] == pytest.approx(3e-3)
    # placement keys are the console's: they are not part of the job spec
    assert not {"host", "spares", "region", "priority"} & set(spec.__struct_fields__)


def test_the_shipped_inventory_shows_commented_ssh_examples() -> None:
    text = SHIPPED.read_text(encoding="utf-8")
    commented = [line for line in text.splitlines() if line.startswith("#")]
    assert any(line.startswith("# [hosts.") for line in commented)
    assert any('transport = "ssh"' in line for line in commented)
    assert any("addresses" in line for line in commented)


def test_the_shipped_commented_provisioner_loads_when_uncommented(short_tmp: Path) -> None:
    lines = SHIPPED.read_text(encoding="utf-8").splitlines()
    start = lines.index("# [provisioner]")
    block = []
    for line in lines[start:]:
        if not line.startswith("# "):
            break
        block.append(line[2:])
    copy = short_tmp / "inventory.toml"
    copy.write_text("\n".join(lines) + "\n" + "\n".join(block) + "\n", encoding="utf-8")
    prov = load(copy).provisioner
    assert prov is not None and prov.min_spares == {"us-east": 1}
    assert prov.command == ["examples/provision_skypilot.sh", "up"]


def test_local_host_roots_resolve_beside_the_inventory(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir("/")  # not the inventory's folder: the cwd must not matter
    assert load(SHIPPED).host_root("local-a") == str((REPO / ".hotspare/hosts/local-a").resolve())
    copy = short_tmp / "elsewhere" / "inventory.toml"
    copy.parent.mkdir()
    shutil.copy(SHIPPED, copy)
    inv = load(copy)
    for name in inv.hosts:
        assert inv.host_root(name) == str(copy.parent.resolve() / ".hotspare/hosts" / name)
    assert inv.state_dir == copy.parent.resolve() / ".hotspare"


def test_python_of_a_host(tmp_path: Path) -> None:
    path = tmp_path / "inventory.toml"
    path.write_text(
        '[regions.r]\n[hosts.loc]\nregion = "r"\ntransport = "local"\nroot = "a"\n'
        '[hosts.far]\nregion = "r"\naddress = "10.0.0.1"\nroot = "/data/hs"\n'
        '[hosts.own]\nregion = "r"\naddress = "10.0.0.2"\nroot = "/data/hs"\n'
        'python = "/opt/py/bin/python3"\n'
    )
    inv = load(path)
    assert load(SHIPPED).python("local-a") == sys.executable
    assert inv.python("loc") == sys.executable
    assert inv.python("far") == "python3"
    assert inv.python("own") == "/opt/py/bin/python3"
    assert inv.host_root("far") == "/data/hs"  # an ssh host's root is a path on that host
    assert inv.hosts["far"].transport == "ssh"  # the default transport


# --- malformed inventories -----------------------------------------------------------------

H = '[regions.r]\n[hosts.h]\nregion = "r"\ntransport = "local"\nroot = "x"\n'  # lines 1-5
H3 = H + "".join(f'[hosts.{n}]\nregion = "r"\ntransport = "local"\nroot = "x"\n' for n in "gk")
"""Hosts h, g and k: lines 1-13."""
SSH = '[regions.r]\n[hosts.h]\nregion = "r"\nroot = "x"\n'  # lines 1-4, an ssh host

MALFORMED: list[tuple[str, str | bytes, list[str]]] = [
    ("toml-syntax", "[regions.r]\nprovider = \n", ["{p}:2: TOML syntax error: Invalid value"]),
    (
        "toml-unclosed-header",
        "[regions.r]\n[hosts\n",
        ["{p}:2: TOML syntax error: Expected ']'"],
    ),
    (
        "toml-duplicate-key",
        '[regions.r]\nprovider = "a"\nprovider = "b"\n',
        ["{p}:3: TOML syntax error: Cannot overwrite a value"],
    ),
    (
        "toml-duplicate-table",
        "[regions.r]\n[regions.r]\n",
        ["{p}:2: TOML syntax error: Cannot declare ('regions', 'r') twice"],
    ),
    (
        "unknown-top-level-table",
        '[hostz.a]\nregion = "r"\n',
        ["{p}:1: hostz: unknown key `hostz` (did you mean `hosts`?)"],
    ),
    (
        "host-unknown-key",
        SSH + 'adress = "10.0.0.1"\n',
        ["{p}:5: hosts.h.adress: unknown key `adress` (did you mean `address`?)"],
    ),
    (
        "host-unknown-key-inline-table",
        '[regions.r]\n[hosts]\nh = { region = "r", root = "x", adress = "a" }\n',
        ["{p}:3: hosts.h.adress: unknown key `adress` (did you mean `address`?)"],
    ),
    (
        "port-wrong-type",
        SSH + 'address = "a"\nport = "22"\n',
        ["{p}:6: hosts.h.port: Expected `int | null`, got `str`"],
    ),
    (
        "port-bool",
        SSH + 'address = "a"\nport = true\n',
        ["{p}:6: hosts.h.port: Expected `int | null`, got `bool`"],
    ),
    (
        "port-out-of-range",
        SSH + 'address = "a"\nport = 70000\n',
        ["{p}:6: hosts.h.port: Expected `int` <= 65535, got 70000"],
    ),
    (
        "port-zero",
        SSH + 'address = "a"\nport = 0\n',
        ["{p}:6: hosts.h.port: Expected `int` >= 1, got 0"],
    ),
    (
        "host-region-unknown",
        '[regions.r]\n[hosts.h]\nregion = "q"\ntransport = "local"\nroot = "x"\n',
        ["{p}:3: hosts.h.region: unknown region 'q' (have: r)"],
    ),
    (
        "host-region-missing",
        '[regions.r]\n[hosts.h]\ntransport = "local"\nroot = "x"\n',
        ["{p}:2: hosts.h: Object missing required field `region`"],
    ),
    (
        "host-root-missing",
        '[regions.r]\n[hosts.h]\nregion = "r"\ntransport = "local"\n',
        ["{p}:2: hosts.h: Object missing required field `root`"],
    ),
    (
        "ssh-host-without-address",
        SSH,
        ["{p}:2: hosts.h: an ssh host needs `address` or `addresses`"],
    ),
    (
        "ssh-host-empty-addresses",
        SSH + "addresses = []\n",
        ["{p}:2: hosts.h: an ssh host needs `address` or `addresses`"],
    ),
    (
        "address-and-addresses",
        SSH + 'address = "a"\naddresses = ["b"]\n',
        ["{p}:6: hosts.h.addresses: give `address` or `addresses`, not both"],
    ),
    (
        "addresses-not-a-list",
        SSH + 'addresses = "a"\n',
        ["{p}:5: hosts.h.addresses: Expected `array`, got `str`"],
    ),
    (
        "local-host-with-address",
        H + 'address = "10.0.0.1"\n',
        ["{p}:2: hosts.h: a local host takes no address, port or proxy_jump"],
    ),
    (
        "local-host-with-port",
        H + "port = 22\n",
        ["{p}:2: hosts.h: a local host takes no address, port or proxy_jump"],
    ),
    (
        "empty-root",
        '[regions.r]\n[hosts.h]\nregion = "r"\ntransport = "local"\nroot = "  "\n',
        ["{p}:5: hosts.h.root: must not be empty"],
    ),
    (
        "root-with-nul",
        '[regions.r]\n[hosts.h]\nregion = "r"\ntransport = "local"\nroot = "a\\u0000b"\n',
        ["{p}:5: hosts.h.root: must not contain a NUL character"],
    ),
    (
        "address-with-nul",
        SSH + 'addresses = ["a", "b\\u0000"]\n',
        ["{p}:5: hosts.h.addresses: must not contain a NUL character"],
    ),
    (
        "local-root-of-unknown-user",
        '[regions.r]\n[hosts.h]\nregion = "r"\ntransport = "local"\n'
        'root = "~no-such-user-here/x"\n',
        ["{p}:5: hosts.h.root: not a usable folder on this machine"],
    ),
    (
        "transport-telnet",
        '[regions.r]\n[hosts.h]\nregion = "r"\ntransport = "telnet"\nroot = "x"\n',
        ["{p}:4: hosts.h.transport: Invalid enum value 'telnet' (expected 'local' or 'ssh')"],
    ),
    (
        "role-boss",
        H + 'role = "boss"\n',
        ["{p}:6: hosts.h.role: Invalid enum value 'boss' (expected 'primary' or 'spare')"],
    ),
    ("negative-gpus", H + "gpus = -1\n", ["{p}:6: hosts.h.gpus: Expected `int` >= 0, got -1"]),
    ("tags-not-a-list", H + 'tags = "a"\n', ["{p}:6: hosts.h.tags: Expected `array`, got `str`"]),
    (
        "host-not-a-table",
        "[regions.r]\n[hosts]\nh = 1\n",
        ["{p}:3: hosts.h: Expected `object`, got `int`"],
    ),
    ("hosts-is-3", "hosts = 3\n", ["{p}:1: hosts: Expected `object`, got `int`"]),
    ("regions-not-a-table", 'regions = "r"\n', ["{p}:1: regions: Expected `object`, got `str`"]),
    (
        "region-not-a-table",
        "regions = { r = 1 }\n",
        ["{p}:1: regions.r: Expected `object`, got `int`"],
    ),
    (
        "region-unknown-key",
        '[regions.r]\nprovidr = "x"\n',
        ["{p}:2: regions.r.providr: unknown key `providr` (did you mean `provider`?)"],
    ),
    (
        "region-name-with-space",
        '[regions."r r"]\n',
        ['{p}:1: regions."r r": a region name may hold only letters, digits'],
    ),
    (
        "host-name-shell-metacharacters",
        '[regions.r]\n[hosts."a;rm -rf /"]\nregion = "r"\ntransport = "local"\nroot = "x"\n',
        ['{p}:2: hosts."a;rm -rf /": a host name may hold only letters, digits'],
    ),
    (
        "host-name-command-substitution",
        '[regions.r]\n[hosts."$(touch MARKER)"]\nregion = "r"\ntransport = "local"\nroot = "x"\n',
        ['{p}:2: hosts."$(touch MARKER)": a host name may hold only letters, digits'],
    ),
    (
        "host-name-with-newline",
        '[regions.r]\n[hosts."a\\nb"]\nregion = "r"\ntransport = "local"\nroot = "x"\n',
        ['{p}:2: hosts."a\\nb": a host name may hold only letters, digits'],
    ),
    (
        "host-name-empty",
        '[regions.r]\n[hosts.""]\nregion = "r"\ntransport = "local"\nroot = "x"\n',
        ['{p}:2: hosts."": a host name may hold only letters, digits'],
    ),
    (
        "job-host-unknown",
        H + '[jobs.j]\nhost = "zz"\nsteps = 1\n',
        ["{p}:7: jobs.j.host: unknown host 'zz' (have: h)"],
    ),
    (
        "job-spare-unknown",
        H + '[jobs.j]\nhost = "h"\nspares = ["zz"]\nsteps = 1\n',
        ["{p}:8: jobs.j.spares: unknown host 'zz' (have: h)"],
    ),
    (
        "job-spare-is-its-host",
        H + '[jobs.j]\nhost = "h"\nspares = ["h"]\nsteps = 1\n',
        ["{p}:8: jobs.j.spares: 'h' is one of the job's own hosts"],
    ),
    (
        "job-host-and-hosts",
        H + '[jobs.j]\nhost = "h"\nhosts = ["h", "h"]\nsteps = 1\n',
        ["{p}:8: jobs.j.hosts: give `host` or `hosts`, not both"],
    ),
    (  # the staged socket /srv/d.../jobs/j/.executor.sock is 108 bytes: one too many
        "root-too-deep-for-a-socket",
        '[regions.r]\n[hosts.h]\nregion = "r"\naddress = "10.0.0.1"\nroot = "/srv/ddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddd"\n'
        '[jobs.j]\nhost = "h"\nsteps = 1\n',
        [
            "{p}:5: hosts.h.root: too deep for job 'j': its executor socket would be "
            "/srv/ddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddd/jobs/j/.executor.sock (108 bytes; a Unix socket path holds at most 107)"
        ],
    ),
    (
        "job-hosts-one",
        H + '[jobs.j]\nhosts = ["h"]\nsteps = 1\n',
        ["{p}:7: jobs.j.hosts: a job on one host says `host = ...`"],
    ),
    (
        "job-hosts-unknown",
        H + '[jobs.j]\nhosts = ["h", "zz"]\nsteps = 1\n',
        ["{p}:7: jobs.j.hosts: unknown host 'zz' (have: h)"],
    ),
    (
        "job-hosts-twice",
        H + '[jobs.j]\nhosts = ["h", "h"]\nsteps = 1\n',
        ["{p}:7: jobs.j.hosts: a host is named twice"],
    ),
    (
        "job-procs-per-host-zero",
        H + '[jobs.j]\nhosts = ["h"]\nprocs_per_host = 0\nsteps = 1\n',
        ["{p}:8: jobs.j.procs_per_host: Expected `int` >= 1"],
    ),
    (
        "job-torch-procs-per-host-past-the-gpus",
        "".join(
            f'[hosts.{n}]\nregion = "r"\ntransport = "local"\nroot = "x"\ngpus = 2\n' for n in "hg"
        ).join(["[regions.r]\n", '[jobs.j]\nhosts = ["h", "g"]\nprocs_per_host = 4\nsteps = 1\n']),
        [
            "{p}:14: jobs.j.procs_per_host: 4 ranks per host take a GPU each; host h has 2 (or "
            "set procs_per_host = 2)"
        ],
    ),
    (
        "job-torch-procs-per-host",
        H + "[jobs.j]\nprocs_per_host = 2\nsteps = 1\n",
        [
            "{p}:7: jobs.j.procs_per_host: the torch kind runs more than one rank per host in a job on several `hosts` for now (one host trains one rank)"
        ],
    ),
    (
        "job-min-hosts-on-one-host",
        H + "[jobs.j]\nmin_hosts = 1\nsteps = 1\n",
        ["{p}:7: jobs.j.min_hosts: elastic keys are for a job on several `hosts`"],
    ),
    (
        "job-min-hosts-zero",
        H3 + '[jobs.j]\nhosts = ["h", "g", "k"]\nmin_hosts = 0\nsteps = 1\n',
        ["{p}:16: jobs.j.min_hosts: Expected `int` >= 1"],
    ),
    (
        "job-min-hosts-above-hosts",
        H3 + '[jobs.j]\nhosts = ["h", "g", "k"]\nmin_hosts = 4\nsteps = 1\n',
        ["{p}:16: jobs.j.min_hosts: 4 is more than the 3 hosts"],
    ),
    (
        "job-logical-ranks-below-hosts",
        H3 + '[jobs.j]\nhosts = ["h", "g", "k"]\nlogical_ranks = 2\nsteps = 1\n',
        ["{p}:16: jobs.j.logical_ranks: 2 is fewer than the 3 hosts (each runs one at least)"],
    ),
    (
        "job-elastic-command-kind",
        H3
        + '[jobs.j]\nhosts = ["h", "g"]\ndeterministic_reduce = true\nsteps = 1\n'
        + 'executor = "command"\n[jobs.j.command]\nargv = ["true"]\n',
        ["{p}:16: jobs.j.deterministic_reduce: elastic jobs are the torch kind's for now"],
    ),
    (
        "job-parallel-unknown",
        H3 + '[jobs.j]\nhosts = ["h", "g"]\nparallel = "tp"\nsteps = 1\n',
        ["{p}:16: jobs.j.parallel: Invalid enum value 'tp' (expected 'ddp' or 'fsdp')"],
    ),
    (
        "job-fsdp-on-one-host",
        H + '[jobs.j]\nparallel = "fsdp"\nsteps = 1\n',
        ["{p}:7: jobs.j.parallel: fsdp shards the model over a job's `hosts` (two or more)"],
    ),
    (
        "job-fsdp-deterministic",
        H3
        + '[jobs.j]\nhosts = ["h", "g"]\nparallel = "fsdp"\ndeterministic_reduce = true\n'
        + "steps = 1\n",
        ["{p}:16: jobs.j.parallel: fsdp reduce-scatters in an order that cannot be fixed"],
    ),
    (
        "job-fsdp-command-kind",
        H3
        + '[jobs.j]\nhosts = ["h", "g"]\nparallel = "fsdp"\nsteps = 1\n'
        + 'executor = "command"\n[jobs.j.command]\nargv = ["true"]\n',
        ["{p}:16: jobs.j.parallel: fsdp is the torch kind's"],
    ),
    (
        "provisioner-empty-command",
        H + "[provisioner]\ncommand = []\n",
        ["{p}:7: provisioner.command: Expected `array` of length >= 1"],
    ),
    (
        "provisioner-shell-string",
        H + '[provisioner]\ncommand = "make-host --zone a"\n',
        ["{p}:7: provisioner.command: Expected `array`, got `str`"],
    ),
    (
        "provisioner-unknown-key",
        H + '[provisioner]\ncommand = ["x"]\nmax_host = 3\n',
        ["{p}:8: provisioner.max_host: unknown key `max_host` (did you mean `max_hosts`?)"],
    ),
    (
        "provisioner-zero-timeout",
        H + '[provisioner]\ncommand = ["x"]\ntimeout_s = 0\n',
        ["{p}:8: provisioner.timeout_s: Expected `float` > 0.0"],
    ),
    (
        "provisioner-min-spares-unknown-region",
        H + '[provisioner]\ncommand = ["x"]\nmin_spares = { mars = 1 }\n',
        ["{p}:8: provisioner.min_spares.mars: unknown region 'mars' (have: r)"],
    ),
    (
        "provisioner-min-spares-negative",
        H + '[provisioner]\ncommand = ["x"]\nmin_spares = { r = -1 }\n',
        ["{p}:8: provisioner.min_spares: Expected `int` >= 0"],
    ),
    (
        "job-backend-unknown",
        H + '[jobs.j]\nbackend = "mpi"\nsteps = 1\n',
        ["{p}:7: jobs.j.backend: Invalid enum value 'mpi' (expected 'gloo' or 'nccl')"],
    ),
    (
        "job-spares-not-a-list",
        H + '[jobs.j]\nsteps = 1\nspares = "h"\n',
        ["{p}:8: jobs.j.spares: Expected `array`, got `str`"],
    ),
    (
        "job-region-unknown",
        H + '[jobs.j]\nregion = "zz"\nsteps = 1\n',
        ["{p}:7: jobs.j.region: unknown region 'zz' (have: r)"],
    ),
    (
        "job-missing-steps",
        H + '[jobs.j]\nhost = "h"\n',
        ["{p}:6: jobs.j: Object missing required field `steps`"],
    ),
    ("job-zero-steps", H + "[jobs.j]\nsteps = 0\n", ["{p}:7: jobs.j.steps: Expected `int` >= 1"]),
    (
        "job-unknown-key",
        H + "[jobs.j]\nsteps = 1\nchekpoint_every_steps = 5\n",
        [
            "{p}:8: jobs.j.chekpoint_every_steps: unknown key `chekpoint_every_steps` "
            "(did you mean `checkpoint_every_steps`?)"
        ],
    ),
    (
        "job-name-with-slash",
        H + '[jobs."a/b"]\nsteps = 1\n',
        ['{p}:6: jobs."a/b".name: a job name is 1 to 64 letters', "got 'a/b'"],
    ),
    (
        "job-name-differs",
        H + '[jobs.j]\nsteps = 1\nname = "k"\n',
        ["{p}:8: jobs.j.name: differs from the table's name"],
    ),
    (
        "job-config-not-a-table",
        H + "[jobs.j]\nsteps = 1\nconfig = 5\n",
        ["{p}:8: jobs.j.config: Expected `object`, got `int`"],
    ),
    (
        "job-not-a-table",
        "jobs = { j = 5 }\n",
        ["{p}:1: jobs.j: expected a table"],
    ),
    (
        "job-priority-wrong-type",
        H + '[jobs.j]\nsteps = 1\npriority = "high"\n',
        ["{p}:8: jobs.j.priority: Expected `int`, got `str`"],
    ),
    (
        "negative-lease",
        "[console]\nlease_s = -1\n",
        ["{p}:2: console.lease_s: Expected `float` > 0.0, got -1"],
    ),
    (
        "unknown-console-key",
        "[console]\nheartbeat = 1\n",
        ["{p}:2: console.heartbeat: unknown key `heartbeat` (did you mean `heartbeat_s`?)"],
    ),
    (
        "console-not-a-table",
        "console = 1\n",
        ["{p}:1: console: Expected `object`, got `int`"],
    ),
    (
        "zero-missed-heartbeats",
        "[console]\nmissed_heartbeats = 0\n",
        ["{p}:2: console.missed_heartbeats: Expected `int` >= 1, got 0"],
    ),
    (
        "etcd-ttl-not-under-lease",
        '[console]\nlease_s = 6\netcd = ["127.0.0.1:2379"]\netcd_ttl_s = 6\n',
        ["{p}:4: console.etcd_ttl_s: the leader's etcd lease (6 s) must be shorter than lease_s"],
    ),
    (
        "etcd-default-ttl-short-lease",
        '[console]\nlease_s = 2\netcd = ["127.0.0.1:2379"]\n',
        ["{p}:2: console.lease_s: the leader's etcd lease (2 s) must be shorter than"],
    ),
    (
        "etcd-endpoint-not-host-port",
        '[console]\netcd = ["127.0.0.1:2379; rm -rf /"]\n',
        ["{p}:2: console.etcd: etcd[0] '127.0.0.1:2379; rm -rf /' is not HOST:PORT"],
    ),
    (
        "not-utf8",
        b'[regions.r]\nprovider = "\xff"\n',
        ["{p}:2: not UTF-8 text: byte 0xff at column 13"],
    ),
]


@pytest.mark.parametrize(("body", "expect"), [pytest.param(b, e, id=i) for i, b, e in MALFORMED])
def test_a_malformed_inventory_is_one_line_and_exit_2(
    tmp_path: Path, body: str | bytes, expect: list[str]
) -> None:
    path = tmp_path / "inventory.toml"
    if isinstance(body, bytes):
        path.write_bytes(body)
    else:
        path.write_text(body, encoding="utf-8")
    r = cli("--inventory", str(path), "check")
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    assert r.stdout == ""
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    assert r.stderr.endswith("\n")
    assert lines[0].startswith(f"hotspare: {path}")
    for part in expect:
        assert part.format(p=path) in lines[0]


def test_malformed_cases_are_distinct_and_many() -> None:
    assert len(MALFORMED) >= 30
    assert len({i for i, _, _ in MALFORMED}) == len(MALFORMED)
    assert len({b for _, b, _ in MALFORMED}) == len(MALFORMED)


@pytest.mark.parametrize(
    ("make", "expect"),
    [
        pytest.param(lambda p: p.mkdir(), "{p}: is a directory, not a TOML file", id="directory"),
        pytest.param(lambda p: None, "{p}: no such file", id="missing"),
    ],
)
def test_an_inventory_that_cannot_be_read_is_one_line_and_exit_2(
    tmp_path: Path, make: Any, expect: str
) -> None:
    path = tmp_path / "inventory.toml"
    make(path)
    r = cli("--inventory", str(path), "check")
    assert r.returncode == 2
    assert r.stdout == ""
    assert r.stderr == f"hotspare: {expect.format(p=path)}\n"


@pytest.mark.parametrize("body", ["", "# nothing here yet\n\n"], ids=["empty", "only-comments"])
def test_an_empty_inventory_is_valid_and_checks_nothing(tmp_path: Path, body: str) -> None:
    path = tmp_path / "inventory.toml"
    path.write_text(body)
    inv = load(path)
    assert (inv.hosts, inv.regions, inv.jobs) == ({}, {}, {})
    assert inv.console.lease_s == 10.0  # the defaults
    r = cli("--inventory", str(path), "check")
    assert (r.returncode, r.stderr) == (0, "")
    lines = r.stdout.splitlines()
    assert len(lines) == 1  # the header, no hosts
    assert lines[0].split()[0] == "HOST"
    assert lines[0].split()[-1] == "STATUS"


def test_the_console_does_not_import_torch() -> None:
    code = (
        "import sys\n"
        "import console.cli, console.inventory, console.reach.check, console.reach.deploy, console.reach.preflight\n"
        "import console.reach.transport.factory\n"
        "assert 'console.inventory' in sys.modules\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy')))\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env_with(), capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


# --- appending a host ----------------------------------------------------------------------

NEW_HOST = {"region": "eu-west", "transport": "local", "root": ".hotspare/hosts/local-d"}


def _with_comments(tmp_path: Path, *, trailing_newline: bool = True) -> Path:
    path = tmp_path / "inventory.toml"
    text = SHIPPED.read_text(encoding="utf-8") + "# the end   \n# really"
    path.write_text(text + ("\n" if trailing_newline else ""), encoding="utf-8")
    return path


@pytest.mark.parametrize("trailing_newline", [True, False], ids=["newline", "no-newline"])
def test_append_host_keeps_every_original_byte(short_tmp: Path, trailing_newline: bool) -> None:
    path = _with_comments(short_tmp, trailing_newline=trailing_newline)
    original = path.read_bytes()
    inv = append_host(path, "local-d", NEW_HOST)
    after = path.read_bytes()
    assert after.startswith(original)
    assert len(after) > len(original)
    added = after[len(original) :].decode()
    assert "[hosts.local-d]" in added
    assert "local-a" not in added  # only the new table was written
    assert "# really" in after.decode()  # comments survive
    assert set(inv.hosts) == {"local-a", "local-b", "local-c", "local-d"}
    d = load(path).hosts["local-d"]
    assert (d.region, d.transport, d.root) == ("eu-west", "local", ".hotspare/hosts/local-d")
    assert inv.jobs["demo"].placement.host == "local-a"

    # a second append is again a pure suffix
    append_host(path, "ssh-e", {"region": "us-east", "address": "10.0.0.9", "root": "/hs"})
    assert path.read_bytes().startswith(after)
    assert load(path).hosts["ssh-e"].all_addresses() == ["10.0.0.9"]
    assert sorted(p.name for p in short_tmp.iterdir()) == ["inventory.toml"]


def test_append_host_refuses_a_duplicate_name(short_tmp: Path) -> None:
    path = _with_comments(short_tmp)
    original = path.read_bytes()
    with pytest.raises(ConfigError) as e:
        append_host(path, "local-b", NEW_HOST)
    assert str(e.value).startswith(str(path))
    assert "hosts.local-b" in str(e.value)
    assert "already exists" in str(e.value)
    assert path.read_bytes() == original
    assert sorted(p.name for p in short_tmp.iterdir()) == ["inventory.toml"]


@pytest.mark.parametrize(
    ("name", "table", "expect"),
    [
        pytest.param(
            "local-d",
            {**NEW_HOST, "region": "mars"},
            "hosts.local-d.region: unknown region 'mars'",
            id="unknown-region",
        ),
        pytest.param(
            "local-d",
            {**NEW_HOST, "adress": "x"},
            "hosts.local-d.adress: unknown key `adress` (did you mean `address`?)",
            id="unknown-key",
        ),
        pytest.param(
            "x;touch MARKER",
            NEW_HOST,
            'hosts."x;touch MARKER": a host name may hold only',
            id="hostile-name",
        ),
    ],
)
def test_append_host_refuses_an_invalid_host(
    short_tmp: Path, name: str, table: dict[str, Any], expect: str
) -> None:
    path = _with_comments(short_tmp)
    original = path.read_bytes()
    with pytest.raises(ConfigError) as e:
        append_host(path, name, table)
    message = str(e.value)
    assert message.startswith(f"{path}:")  # the user's file, with a line number
    assert ".candidate" not in message
    assert expect in message
    assert "\n" not in message
    assert path.read_bytes() == original
    assert sorted(p.name for p in short_tmp.iterdir()) == ["inventory.toml"]


# --- hostile values ------------------------------------------------------------------------

HOSTILE = [
    "$(touch MARKER)",
    "`touch MARKER`",
    "a;touch MARKER",
    'a"b',
    "a'b",
    "a\nb",
    "a b",
    "../up",
    "a|b",
]


def _write(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(tomli_w.dumps(data), encoding="utf-8")
    return path


@pytest.mark.parametrize("bad", HOSTILE)
@pytest.mark.parametrize("kind", ["hosts", "jobs", "regions"])
def test_hostile_names_are_refused(tmp_path: Path, kind: str, bad: str) -> None:
    data: dict[str, Any] = {
        "regions": {"r": {}},
        "hosts": {"h": {"region": "r", "transport": "local", "root": "x"}},
    }
    if kind == "hosts":
        data["hosts"][bad] = {"region": "r", "transport": "local", "root": "x"}
    elif kind == "jobs":
        data["jobs"] = {bad: {"steps": 1, "host": "h"}}
    else:
        data["regions"][bad] = {}
    path = _write(tmp_path / "inventory.toml", data)
    with pytest.raises(ConfigError) as e:
        load(path)
    message = str(e.value)
    assert "\n" not in message
    assert message.startswith(f"{path}:")
    what = {
        "hosts": "a host name may hold only",
        "jobs": "a job name is 1 to 64 letters",
        "regions": "a region name may hold only",
    }[kind]
    assert what in message
    assert not list(tmp_path.rglob("MARKER*"))


HOSTILE_VALUE = "r o o t $(touch MARKER) `touch MARKER2` ;echo pwned; 'q\" \n nl | x & y"


def test_hostile_values_that_are_legal_are_kept_verbatim(short_tmp: Path) -> None:
    tmp_path = short_tmp  # the hostile root under it still leaves room for a job's sockets
    data = {
        "regions": {"r": {"notes": HOSTILE_VALUE}},
        "hosts": {
            "loc": {
                "region": "r",
                "transport": "local",
                "root": HOSTILE_VALUE,
                "python": f"/opt/{HOSTILE_VALUE}/python",
                "tags": [HOSTILE_VALUE],
            },
            "far": {
                "region": "r",
                "address": "10.0.0.1",
                "user": HOSTILE_VALUE,
                "root": f"/data/{HOSTILE_VALUE}",
                "identity": f"~/{HOSTILE_VALUE}",
            },
        },
        "jobs": {"j": {"steps": 1, "host": "loc", "config": {"corpus": HOSTILE_VALUE}}},
    }
    inv = load(_write(tmp_path / "inventory.toml", data))
    assert inv.host_root("loc") == str(tmp_path.resolve() / HOSTILE_VALUE)
    assert inv.python("loc") == f"/opt/{HOSTILE_VALUE}/python"
    assert inv.hosts["far"].user == HOSTILE_VALUE
    assert inv.host_root("far") == f"/data/{HOSTILE_VALUE}"
    assert inv.jobs["j"].spec.config["corpus"] == HOSTILE_VALUE


def _no_markers(*folders: Path) -> None:
    for folder in folders:
        found = [p for p in folder.rglob("*") if p.name.startswith("MARKER")]
        assert not found, found


async def test_hostile_root_and_python_never_reach_a_shell(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # a relative MARKER would land here
    inv_path = _write(
        tmp_path / "inventory.toml",
        {
            "regions": {"r": {}},
            "hosts": {"evil": {"region": "r", "transport": "local", "root": HOSTILE_VALUE}},
        },
    )
    inv: Inventory = load(inv_path)
    root = inv.host_root("evil")
    assert root == str(tmp_path.resolve() / HOSTILE_VALUE)
    assert not Path(root).exists()

    # the interpreter itself sits under a hostile path (a symlink to this one)
    pydir = tmp_path / "py $(touch MARKER3) `touch MARKER4`;"
    pydir.mkdir()
    python = pydir / "python"
    python.symlink_to(sys.executable)

    t = LocalTransport("evil")
    bundle = build_bundle()
    first = await deploy(t, root, str(python), bundle)
    assert first.uploaded
    assert first.path == bundle_dir(root, bundle)
    assert (Path(first.path) / ".complete").read_text() == bundle.hash
    assert (Path(first.path) / "protocol" / "config.py").is_file()
    assert (Path(first.path) / "executors").is_dir()
    second = await deploy(t, root, str(python), bundle)
    assert (second.uploaded, second.path) == (False, first.path)

    pf = await preflight(t, root=root, python=inv.python("evil"), bundle=bundle)
    assert pf.problems == []
    assert pf.ok
    assert pf.bundle
    assert pf.python == "{}.{}.{}".format(*sys.version_info[:3])

    # a detached process: hostile working folder, log path, argument and environment value
    out = Path(root) / f"out {HOSTILE_VALUE}"
    log = Path(root) / f"log {HOSTILE_VALUE}"
    code = (
        "import os, sys\n"
        "print('hello', sys.argv[2])\n"
        "open(sys.argv[1], 'w').write(os.getcwd() + '|' + os.environ['HOSTILE'] + '|' + sys.argv[2])\n"
    )
    pid = await t.start_detached(
        [sys.executable, "-c", code, str(out), HOSTILE_VALUE],
        log_path=str(log),
        env={"HOSTILE": HOSTILE_VALUE},
        cwd=root,
    )
    assert pid > 0
    wait_for(lambda: out.exists() and out.read_text().count("|") >= 2, 30, "the detached process")
    assert out.read_text() == f"{root}|{HOSTILE_VALUE}|{HOSTILE_VALUE}"
    wait_for(lambda: log.exists() and "hello" in log.read_text(), 30, "the detached log")
    assert log.read_text() == f"hello {HOSTILE_VALUE}\n"
    assert "pwned" not in log.read_text().replace(HOSTILE_VALUE, "")

    _no_markers(tmp_path)
    for folder in (REPO, Path("/"), Path(root).parent):
        assert not [p for p in os.listdir(folder) if p.startswith("MARKER")], folder


async def test_a_hostile_environment_key_is_refused(tmp_path: Path) -> None:
    t = LocalTransport("h")
    with pytest.raises(ValueError, match="not an environment variable name"):
        await t.start_detached(
            [sys.executable, "-c", "pass"],
            log_path=str(tmp_path / "log"),
            env={"A=$(touch MARKER);B": "1"},
        )
    _no_markers(tmp_path)


def test_an_elastic_job_s_size_and_logical_ranks(tmp_path: Path) -> None:
    path = tmp_path / "inventory.toml"
    body = H3.replace('root = "x"', f'root = "{tmp_path}"')
    path.write_text(
        body
        + '[jobs.e]\nhosts = ["h", "g", "k"]\nmin_hosts = 2\nsteps = 1\n'
        + '[jobs.x]\nhosts = ["h", "g"]\nlogical_ranks = 6\nsteps = 1\n'
        + '[jobs.f]\nhosts = ["h", "g"]\nsteps = 1\n'
        + '[jobs.c]\nhosts = ["h", "g"]\nsteps = 1\nexecutor = "command"\n'
        + '[jobs.c.command]\nargv = ["true"]\n',
        encoding="utf-8",
    )
    inv = load(path)
    assert (inv.min_hosts("e"), inv.logical_ranks("e")) == (2, 3)
    assert (inv.min_hosts("x"), inv.logical_ranks("x")) == (2, 6)
    assert (inv.min_hosts("f"), inv.logical_ranks("f")) == (2, 2), "not elastic: all its hosts"
    assert inv.logical_ranks("c") is None, "a command keeps its own batch"


def test_the_shipped_inventory_s_commented_elastic_job_loads_when_uncommented(
    tmp_path: Path,
) -> None:
    """The example a reader copies must be valid: its hosts made local, uncommented, loaded."""
    text = SHIPPED.read_text(encoding="utf-8")
    example = text[text.index("# [jobs.big]") :].split("\n\n")[0]  # to the next blank line
    jobs = "\n".join(line.removeprefix("# ").removeprefix("#") for line in example.splitlines())
    hosts = "".join(
        f'[hosts.gpu-{i}]\nregion = "r"\ntransport = "local"\nroot = "{tmp_path / str(i)}"\n'
        for i in (1, 2, 3)
    )
    path = tmp_path / "inventory.toml"
    path.write_text("[regions.r]\n" + hosts + jobs + "\n", encoding="utf-8")
    inv = load(path)
    assert (inv.min_hosts("big"), inv.logical_ranks("big")) == (2, 3)
    assert inv.jobs["big"].placement.deterministic_reduce


def test_a_host_appended_then_removed_leaves_the_file_as_it_was(tmp_path: Path) -> None:
    path = tmp_path / "inventory.toml"
    body = H.replace('root = "x"', f'root = "{tmp_path}"') + "# the next table's own comment\n"
    body += '[jobs.j]\nhost = "h"\nsteps = 1\n'
    path.write_text(body, encoding="utf-8")
    append_host(path, "p1", {"region": "r", "transport": "local", "root": str(tmp_path / "p1")})
    assert "p1" in load(path).hosts
    inv = remove_host(path, "p1")
    assert "p1" not in inv.hosts
    assert path.read_text(encoding="utf-8") == body


def test_a_host_a_job_names_is_not_removed(tmp_path: Path) -> None:
    path = tmp_path / "inventory.toml"
    body = H.replace('root = "x"', f'root = "{tmp_path}"') + '[jobs.j]\nhost = "h"\nsteps = 1\n'
    path.write_text(body, encoding="utf-8")
    with pytest.raises(ConfigError, match="unknown host 'h'"):
        remove_host(path, "h")
    assert path.read_text(encoding="utf-8") == body
    with pytest.raises(ConfigError, match=r"no table \[hosts.zz\]"):
        remove_host(path, "zz")


def test_a_root_whose_sockets_just_fit_loads_and_one_byte_more_is_refused(tmp_path: Path) -> None:
    """The limit is the kernel's: a staged socket path of 107 bytes binds (tests/executors/
    test_listen.py binds one), 108 does not. A root the host expands is left to the executor."""

    def body(root: str, job: str = "j") -> str:
        return (
            f'[regions.r]\n[hosts.h]\nregion = "r"\naddress = "10.0.0.1"\nroot = "{root}"\n'
            f'[jobs.{job}]\nhost = "h"\nsteps = 1\n'
        )

    path = tmp_path / "inventory.toml"
    fits = "/srv/" + "d" * 80  # /srv/d.../jobs/j/.executor.sock: 107 bytes
    path.write_text(body(fits))
    assert load(path).host_root("h") == fits
    path.write_text(body(fits, job="jj"))  # a longer job name is a longer path
    with pytest.raises(ConfigError, match=r"too deep for job 'jj'.*108 bytes"):
        load(path)
    path.write_text(body("~/" + "d" * 200))
    assert load(path).host_root("h").startswith("~/")
