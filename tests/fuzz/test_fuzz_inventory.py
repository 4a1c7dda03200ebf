"""The inventory loader against thousands of malformed and hostile mutations of the shipped file.

Each mutation (lines deleted, duplicated or swapped, values of the wrong type, bad keys,
unicode, NUL, huge values, shell metacharacters, bytes flipped, truncation, deep nesting)
either loads or is one ``ConfigError`` line that starts with the file's path (and its line,
where one is given, lies in the file). Never another exception. Then once through the CLI.
"""

from __future__ import annotations

import collections
import random
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from support.helpers import REPO

from console.inventory import Inventory, load
from protocol.errors import ConfigError

SHIPPED = (REPO / "inventory.toml").read_text(encoding="utf-8")
CASES = 2000
SEED = 6006
MAX_ERROR = 2000
"""An error line quotes at most this much: a 100 kB value is not echoed whole."""

VALUES = [
    "1", "-1", "0", "99999999999999999999999", "1e400", "-inf", "nan", "true", "false",
    '""', '" "', "[]", "{}", "[1, \"a\"]", "{ a = 1 }", "1979-05-27T07:32:00Z", "07:32:00",
    '"x"', "'$(rm -rf /)'", '"; reboot #"', '"`id`"', '"a|b&c>d<e"', '"../../../../etc/passwd"',
    '"~root/.ssh"', '"\\u0000"', '"nul\\u0000inside"', '"\\u202eevil"', '"ünïcödé ✓ 🚀"',
    '"\\n\\r\\t"', '"' + "x" * 100_000 + '"', "[" + ", ".join(["1"] * 5000) + "]",
    '"""multi\nline"""', "'literal \\ no escape'",
]  # fmt: skip
KEYS = [
    "region", "transport", "root", "role", "host", "spares", "steps", "seed", "lease_s",
    "heartbeat_s", "state_dir", "priority", "provider", "gpus", "port", "addresses", "python",
    "n_layer", "hearbeat_s", "rooot", '"a b"', '"ключ"', '"$(id)"', '"a.b"', "'quoted'",
    "x" * 300, "executor", "workload", "checkpoint_every_steps", "warm_standby", "name",
]  # fmt: skip
HEADERS = [
    "[hosts.\"a;b\"]", "[hosts.'$(id)']", '[hosts."ünï"]', "[regions.\"\\u0000\"]",
    "[jobs.\"a/b\"]", "[jobs." + "j" * 200 + "]", "[[hosts]]", "[console.health]",
    "[hosts.local-a]", "[jobs.demo.config]", "[nope]", "[hosts.x.y.z]", "[]", "[hosts.",
]  # fmt: skip
SNIPPETS = ["\x00", "\ufeff", "\u202e", "\ud7ff", "\t", "\r", "\r\n", "=", "[", '"', "'''", "#"]
BAD_BYTES = [b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x00", b"\x80\x80"]


def _lines(rng: random.Random) -> list[str]:
    return SHIPPED.splitlines()


def _value_lines(lines: list[str]) -> list[int]:
    return [i for i, ln in enumerate(lines) if re.match(r"^\s*[A-Za-z_\"'-]+\s*=", ln)]


def m_delete(rng: random.Random, lines: list[str]) -> str:
    for _ in range(rng.randint(1, 3)):
        del lines[rng.randrange(len(lines))]
    return "\n".join(lines)


def m_duplicate(rng: random.Random, lines: list[str]) -> str:
    i = rng.randrange(len(lines))
    lines.insert(rng.randrange(len(lines)), lines[i])
    return "\n".join(lines)


def m_swap(rng: random.Random, lines: list[str]) -> str:
    i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
    lines[i], lines[j] = lines[j], lines[i]
    return "\n".join(lines)


def m_value(rng: random.Random, lines: list[str]) -> str:
    for _ in range(rng.randint(1, 2)):
        i = rng.choice(_value_lines(lines))
        key = lines[i].split("=", 1)[0]
        lines[i] = f"{key}= {rng.choice(VALUES)}"
    return "\n".join(lines)


def m_key(rng: random.Random, lines: list[str]) -> str:
    i = rng.choice(_value_lines(lines))
    value = lines[i].split("=", 1)[1]
    if rng.random() < 0.5:
        lines[i] = f"{rng.choice(KEYS)} ={value}"
    else:
        lines.insert(i, f"{rng.choice(KEYS)} = {rng.choice(VALUES)}")
    return "\n".join(lines)


def m_header(rng: random.Random, lines: list[str]) -> str:
    i = rng.randrange(len(lines) + 1)
    lines[i:i] = [rng.choice(HEADERS), f"{rng.choice(KEYS)} = {rng.choice(VALUES)}"]
    return "\n".join(lines)


def m_snippet(rng: random.Random, lines: list[str]) -> str:
    text = "\n".join(lines)
    for _ in range(rng.randint(1, 3)):
        at = rng.randrange(len(text) + 1)
        text = text[:at] + rng.choice(SNIPPETS) + text[at:]
    return text


def m_truncate(rng: random.Random, lines: list[str]) -> str:
    text = "\n".join(lines)
    return text[: rng.randrange(len(text) + 1)]


def m_nesting(rng: random.Random, lines: list[str]) -> str:
    depth = rng.choice([50, 500, 5000, 50_000])
    open_, close = rng.choice([("[", "]"), ("{a=", "}")])
    lines.append(f"[jobs.demo.config.deep]\nx = {open_ * depth}1{close * depth}")
    return "\n".join(lines)


def m_host(rng: random.Random, lines: list[str]) -> str:
    """A whole hostile host table, in place of nothing."""
    name = rng.choice(['"a;b"', "ok-host", '"$(reboot)"', '"ü"', "h" * 80])
    fields = {
        "region": rng.choice(['"us-east"', '"nowhere"', "1", '"us-east\\u0000"']),
        "transport": rng.choice(['"ssh"', '"local"', '"telnet"', "true"]),
        "address": rng.choice(['"10.0.0.1"', '"; rm -rf /"', '"-oProxyCommand=id"', '"\\u0000"']),
        "root": rng.choice(['"/srv/$(id)"', '"`reboot`"', '""', '"   "', '"\\u0000"', '"/x"']),
        "python": rng.choice(['"python3; id"', '"/usr/bin/python3"', '"$(id)"']),
        "port": rng.choice(["22", "0", "65536", "-1", '"22"', "1e3"]),
    }
    keep = [f"{k} = {v}" for k, v in fields.items() if rng.random() < 0.8]
    lines += [f"[hosts.{name}]", *keep]
    return "\n".join(lines)


MUTATORS: dict[str, Callable[[random.Random, list[str]], str]] = {
    "delete": m_delete,
    "duplicate": m_duplicate,
    "swap": m_swap,
    "value": m_value,
    "key": m_key,
    "header": m_header,
    "snippet": m_snippet,
    "truncate": m_truncate,
    "nesting": m_nesting,
    "host": m_host,
}


def mutated_bytes(rng: random.Random) -> tuple[str, bytes]:
    kind = rng.choice([*MUTATORS, "bytes"])
    if kind == "bytes":  # flipped bits and bytes that are not UTF-8
        data = bytearray(SHIPPED.encode())
        for _ in range(rng.randint(1, 4)):
            at = rng.randrange(len(data))
            if rng.random() < 0.5:
                data[at] ^= 1 << rng.randrange(8)
            else:
                data[at:at] = rng.choice(BAD_BYTES)
        return kind, bytes(data)
    return kind, MUTATORS[kind](rng, SHIPPED.splitlines()).encode("utf-8", "surrogatepass")


def check_error(e: ConfigError, path: Path, data: bytes) -> None:
    text = str(e)
    assert "\n" not in text and "\r" not in text, text[:300]
    assert text.startswith(f"{path}:") or text.startswith(f"{path} "), text[:300]
    assert len(text) <= MAX_ERROR, f"{len(text)}-char error: {text[:300]}"
    m = re.match(rf"{re.escape(str(path))}:(\d+):", text)
    if m:
        assert 1 <= int(m.group(1)) <= data.count(b"\n") + 1, text[:300]


def test_inventory_loader_survives_2000_hostile_mutations(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    path = tmp_path / "inventory.toml"
    outcome: collections.Counter[str] = collections.Counter()
    start = time.perf_counter()
    for _ in range(CASES):
        kind, data = mutated_bytes(rng)
        path.write_bytes(data)
        try:
            inv = load(path)
        except ConfigError as e:
            check_error(e, path, data)
            outcome[f"{kind}: error"] += 1
        else:
            assert isinstance(inv, Inventory)
            outcome[f"{kind}: loads"] += 1
    elapsed = time.perf_counter() - start
    print(f"{CASES} mutated inventories in {elapsed:.1f} s: {dict(sorted(outcome.items()))}")
    errors = sum(n for k, n in outcome.items() if k.endswith("error"))
    assert sum(outcome.values()) == CASES
    # the mutations mostly break the file, yet some leave it valid: both paths ran
    assert CASES // 2 < errors < CASES
    assert all(f"{k}: error" in outcome for k in [*MUTATORS, "bytes"])


def test_check_with_a_hostile_inventory_is_one_line_and_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(SHIPPED.replace('root = ".hotspare/hosts/local-b"', "root = [[[[1]]]]"))
    proc = subprocess.run(
        [sys.executable, "-m", "console.cli", "check", "--inventory", str(bad)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert str(bad) in lines[0] and "hosts.local-b.root" in lines[0], lines[0]
    assert "Traceback" not in proc.stderr
