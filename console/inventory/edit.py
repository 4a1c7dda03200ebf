"""Changing an inventory file as the console may: a host added at the end (comments and layout
kept), or taken out, each only if the result still loads; the console never rewrites a
user's file otherwise."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import tomli_w

from console.inventory.load import load
from console.inventory.model import Inventory
from protocol.errors import ConfigError


def append_host(path: Path, name: str, table: dict[str, Any]) -> Inventory:
    """Add ``[hosts.NAME]`` at the end of the file (comments and layout kept); validated first."""
    text, new_text = _appended(path, name, table)
    _must_load(path, new_text)
    with open(path, "a", encoding="utf-8") as f:
        f.write(new_text[len(text) :])
    return load(path)


def with_host(path: Path, name: str, table: dict[str, Any]) -> Inventory:
    """The inventory as it would be with ``[hosts.NAME]`` appended, the file untouched;
    ConfigError (naming ``path``) when it would not load."""
    return _must_load(path, _appended(path, name, table)[1])


def _appended(path: Path, name: str, table: dict[str, Any]) -> tuple[str, str]:
    """The file's text, and its text with ``[hosts.NAME]`` appended (no host of that name yet)."""
    if name in load(path).hosts:
        raise ConfigError(f"{path}: hosts.{name}: a host of that name already exists")
    text = path.read_text(encoding="utf-8")
    addition = tomli_w.dumps({"hosts": {name: table}})
    return text, text + ("" if text.endswith("\n") or not text else "\n") + "\n" + addition


def _must_load(path: Path, new_text: str) -> Inventory:
    """The inventory ``new_text`` loads as (beside ``path``, so relative paths mean the same);
    ConfigError naming ``path`` when it would not load."""
    candidate = path.with_name(f".{path.name}.candidate")
    candidate.write_text(new_text, encoding="utf-8")
    try:
        return dataclasses.replace(load(candidate), path=path)
    except ConfigError as e:
        raise ConfigError(str(e).replace(str(candidate), str(path))) from None
    finally:
        candidate.unlink(missing_ok=True)


def remove_host(path: Path, name: str) -> Inventory:
    """Take ``[hosts.NAME]`` out of the file (every other line kept), if what is left still
    loads (no job names the host); ConfigError otherwise, the file untouched."""
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines(keepends=True)
    header = f"[hosts.{name}]"
    starts = [i for i, line in enumerate(lines) if line.strip() == header]
    if len(starts) != 1:
        raise ConfigError(f"{path}: hosts.{name}: no table [hosts.{name}] of its own to remove")
    start = end = starts[0]
    for i in range(start + 1, len(lines)):
        stripped = lines[i].strip()
        if stripped.startswith("["):
            break
        if stripped and not stripped.startswith("#"):
            end = i  # its last key: comments after it belong to what follows
    end += 1
    while start > 0 and not lines[start - 1].strip():
        start -= 1  # the blank lines before it went with it when it was appended
    new_text = "".join(lines[:start] + lines[end:])
    _must_load(path, new_text)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(new_text, encoding="utf-8")
    tmp.replace(path)
    return load(path)
