"""TOML files decoded into typed records, with errors a person can act on.

Every failure is one ``ConfigError`` line: ``FILE:LINE: key.path: what is wrong``
(the line where it can be found), plus "did you mean" for a misspelt key.
"""

from __future__ import annotations

import difflib
import re
import tomllib
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from protocol.errors import ConfigError

T = TypeVar("T")

_AT = re.compile(r"^(?P<what>.*?)(?: - at `\$(?P<path>[^`]*)`)?$")
_UNKNOWN = re.compile(r"Object contains unknown field `(?P<field>[^`]+)`")


def read_toml(path: Path) -> tuple[dict[str, Any], str]:
    """Parse a TOML file; returns the data and its text (for locating lines in later errors)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot read: {e}") from None
    try:
        return tomllib.loads(text), text
    except tomllib.TOMLDecodeError as e:
        m = re.search(r"\(at line (\d+), column (\d+)\)", str(e))
        where = f":{m.group(1)}" if m else ""
        reason = re.sub(r"\s*\(at line \d+, column \d+\)", "", str(e))
        raise ConfigError(f"{path}{where}: TOML syntax error: {reason}") from None


def find_line(text: str, keys: list[str]) -> int | None:
    """Best-effort line number of a dotted key path in TOML text (tables and plain keys)."""
    lines = text.splitlines()
    start = 0
    for depth in range(len(keys), 0, -1):
        header = re.compile(
            r"^\s*\[+\s*" + r"\s*\.\s*".join(re.escape(k) for k in keys[:depth]) + r"\s*\]+"
        )
        for i, line in enumerate(lines):
            if header.match(line):
                if depth == len(keys):
                    return i + 1
                start = i + 1
                rest = keys[depth:]
                key = re.compile(r"^\s*" + re.escape(rest[0]) + r"\s*[=.]")
                for j in range(start, len(lines)):
                    if lines[j].lstrip().startswith("["):
                        break
                    if key.match(lines[j]):
                        return j + 1
                return None
    key = re.compile(r"^\s*" + re.escape(keys[0]) + r"\s*[=.]") if keys else None
    for i, line in enumerate(lines):
        if line.lstrip().startswith("["):
            break
        if key and key.match(line):
            return i + 1
    return None


def _field_names(tp: Any) -> list[str]:
    try:
        return [f.encode_name for f in msgspec.structs.fields(tp)]
    except TypeError:
        return []


def convert(data: Any, tp: type[T], *, file: Path, text: str, prefix: list[str] | None = None) -> T:
    """``msgspec.convert`` with an error that names the file, key path, line and a guess."""
    prefix = prefix or []
    try:
        return msgspec.convert(data, tp)
    except msgspec.ValidationError as e:
        m = _AT.match(str(e))
        assert m is not None
        what, path = m.group("what"), m.group("path") or ""
        keys = prefix + [k for k in re.split(r"\.|\[|\]", path) if k]
        unknown = _UNKNOWN.search(what)
        if unknown:
            field = unknown.group("field")
            keys.append(field)
            owner = tp
            for k in keys[len(prefix) : -1]:
                hints = (
                    {f.encode_name: f.type for f in msgspec.structs.fields(owner)}
                    if _field_names(owner)
                    else {}
                )
                owner = hints.get(k)
            guess = difflib.get_close_matches(field, _field_names(owner) if owner else [], n=1)
            what = f"unknown key `{field}`" + (f" (did you mean `{guess[0]}`?)" if guess else "")
        line = find_line(text, keys)
        where = f"{file}:{line}" if line else str(file)
        keypath = ".".join(keys) or "(top level)"
        raise ConfigError(f"{where}: {keypath}: {what}") from None
