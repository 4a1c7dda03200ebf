"""TOML files decoded into typed records, with errors a person can act on.

Every failure is one ``ConfigError`` line: ``FILE:LINE: key.path: what is wrong``
(the line where it can be found), plus "did you mean" for a misspelt key.
"""

from __future__ import annotations

import difflib
import re
import tomllib
import typing
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from protocol.errors import ConfigError
from protocol.spec import JOB_NAME_PATTERN

T = TypeVar("T")

_AT = re.compile(r"^(?P<what>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.DOTALL)
_PATTERN = re.compile(r"matching regex '(.*)'$")
_UNKNOWN = re.compile(r"Object contains unknown field `(?P<field>[^`]+)`")


def read_toml(path: Path) -> tuple[dict[str, Any], str]:
    """Parse a TOML file; returns the data and its text (for locating lines in later errors)."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a directory, not a TOML file") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror or e}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        column = e.start - (raw.rfind(b"\n", 0, e.start) + 1) + 1
        raise ConfigError(
            f"{path}:{line}: not UTF-8 text: byte 0x{raw[e.start]:02x} at column {column}"
        ) from None
    try:
        return tomllib.loads(text), text
    except RecursionError:  # tomllib recurses once per nested array or inline table
        raise ConfigError(
            f"{path}: TOML syntax error: arrays or inline tables nested too deeply"
        ) from None
    except tomllib.TOMLDecodeError as e:
        msg = str(e)
        m = re.search(r"\(at line (\d+), column (\d+)\)", msg)
        if m:
            where = f":{m.group(1)}"
            reason = f"{msg[: m.start()].rstrip()} (column {m.group(2)})"
        else:
            where = f":{max(1, len(text.splitlines()))}" if "end of document" in msg else ""
            reason = re.sub(r"\s*\(at end of document\)", " at the end of the file", msg)
        raise ConfigError(f"{path}{where}: TOML syntax error: {_one_line(reason)}") from None


def _one_line(s: str) -> str:
    return s.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")


_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def _key_path(keys: list[str]) -> str:
    """Keys as TOML writes a dotted key: ``jobs."a/b".steps``; "(top level)" for none."""
    if not keys:
        return "(top level)"
    return ".".join(
        k if _BARE_KEY.match(k) else msgspec.json.encode(k).decode() for k in map(str, keys)
    )


_PART = r"""(?:[A-Za-z0-9_-]+|"(?:[^"\\]|\\.)*"|'[^']*')"""
_DOTTED = rf"{_PART}(?:\s*\.\s*{_PART})*"
_HEADER = re.compile(rf"^\s*(?P<open>\[\[?)\s*(?P<keys>{_DOTTED})\s*\]\]?\s*(?:#.*)?$")
_KEYVAL = re.compile(rf"^\s*(?P<keys>{_DOTTED})\s*=")
_SPLIT = re.compile(rf"\s*({_PART})\s*(?:\.|$)")


def _split_keys(dotted: str) -> list[str]:
    """``a."b.c".'d'`` -> ``["a", "b.c", "d"]`` (quoted parts unescaped as TOML does)."""
    out = []
    for part in _SPLIT.findall(dotted):
        if part.startswith('"'):
            try:
                part = tomllib.loads(f"k = {part}")["k"]
            except tomllib.TOMLDecodeError:
                part = part[1:-1]
        elif part.startswith("'"):
            part = part[1:-1]
        out.append(part)
    return out


def find_line(text: str, keys: list[str]) -> int | None:
    """Best-effort line number of a key path in TOML text.

    Follows ``[table]`` and ``[[array]]`` headers (an array element's index is a key, as in
    msgspec's paths), dotted and quoted keys. The line that defines ``keys`` wins; else the
    line defining the nearest enclosing key (an inline table, or the table a missing key
    belongs in); else the first line defining something under ``keys``. None if nothing matches.
    """
    if not keys:
        return None
    want = [str(k) for k in keys]
    best: tuple[float, int] | None = None  # (score, line)
    table: list[str] = []
    arrays: dict[tuple[str, ...], int] = {}
    in_string: str | None = None

    def resolve(parts: list[str]) -> list[str]:
        out: list[str] = []
        for part in parts:
            out.append(part)
            n = arrays.get(tuple(out))
            if n is not None:
                out.append(str(n - 1))
        return out

    for number, line in enumerate(text.splitlines(), 1):
        if in_string:
            if line.count(in_string) % 2:
                in_string = None
            continue
        full: list[str] | None = None
        if h := _HEADER.match(line):
            parts = _split_keys(h["keys"])
            if h["open"] == "[[":
                array = (*resolve(parts[:-1]), parts[-1])
                arrays[array] = arrays.get(array, 0) + 1
                table = [*array, str(arrays[array] - 1)]
            else:
                table = resolve(parts)
            full = table
        elif kv := _KEYVAL.match(line):
            full = table + _split_keys(kv["keys"])
            rest = line[kv.end() :]
            for quote in ('"""', "'''"):
                if rest.count(quote) % 2:
                    in_string = quote
                    break
        if full is None:
            continue
        n = min(len(full), len(want))
        if n and full[:n] == want[:n]:
            score = n if len(full) <= len(want) else n - 0.5
            if best is None or score > best[0]:
                best = (score, number)
            if len(full) == len(want):
                return number
    return best[1] if best else None


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
            owner: Any = tp
            for k in keys[len(prefix) : -1]:
                hints = (
                    {f.encode_name: f.type for f in msgspec.structs.fields(owner)}
                    if _field_names(owner)
                    else {}
                )
                owner = hints.get(k)
            guess = difflib.get_close_matches(field, _field_names(owner) if owner else [], n=1)
            what = f"unknown key `{field}`" + (f" (did you mean `{guess[0]}`?)" if guess else "")
        elif (pattern := _PATTERN.search(what)) and pattern.group(1) == JOB_NAME_PATTERN:
            what = (
                "a job name is 1 to 64 letters, digits, '.', '_' or '-', "
                "starting with a letter or digit"
            )
        elif what.startswith("Invalid enum value"):
            choices = _literal_choices(tp, keys[len(prefix) :])
            if choices:
                what += f" (expected {' or '.join(map(repr, choices))})"
        if ", got" not in what and not unknown and not what.startswith("Invalid enum value"):
            value = _lookup(data, keys[len(prefix) :])
            if isinstance(value, str | int | float | bool):
                what += f", got {value!r}"
        line = find_line(text, keys)
        where = f"{file}:{line}" if line else str(file)
        raise ConfigError(f"{where}: {_key_path(keys)}: {_one_line(what)}") from None


def _literal_choices(tp: Any, keys: list[str]) -> list[Any]:
    """The values a ``Literal`` field at ``keys`` (inside struct ``tp``) allows; [] if unknown."""
    for k in keys:
        fields = (
            {f.encode_name: f.type for f in msgspec.structs.fields(tp)} if _field_names(tp) else {}
        )
        tp = fields.get(k)
        if tp is None:
            return []
    choices: list[Any] = []
    for arg in typing.get_args(tp) if typing.get_origin(tp) is not typing.Literal else [tp]:
        if typing.get_origin(arg) is typing.Literal:
            choices.extend(typing.get_args(arg))
    return choices


def _lookup(data: Any, keys: list[str]) -> Any:
    """The value at a msgspec error path, or None where it cannot be found."""
    for k in keys:
        if isinstance(data, dict) and k in data:
            data = data[k]
        elif isinstance(data, list) and k.isdigit() and int(k) < len(data):
            data = data[int(k)]
        else:
            return None
    return data
