"""The executor bundle's content hash: what the console deploys and what every manifest records."""

from __future__ import annotations

import argparse
import hashlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

BUNDLE_PACKAGES = ("executors", "protocol")


def bundle_files(root: Path) -> list[Path]:
    """The bundle's files under ``root`` (the folder holding the packages), in a fixed order."""
    return [p for pkg in BUNDLE_PACKAGES for p in sorted((root / pkg).rglob("*.py"))]


def source_hash(root: Path) -> str:
    """sha256 over each bundle file's relative path and bytes; 12 hex digits."""
    h = hashlib.sha256()
    for path in bundle_files(root):
        h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:12]


class VersionAction(argparse.Action):
    """``--version``: one line from ``line()``, worked out only when asked (hashing the bundle
    on every call of a command run as often as the executor's would cost for nothing)."""

    def __init__(self, option_strings: Sequence[str], dest: str, line: Callable[[], str]) -> None:
        super().__init__(
            option_strings,
            dest,
            nargs=0,
            default=argparse.SUPPRESS,
            help="print the version and exit",
        )
        self.line = line

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        print(self.line())
        parser.exit()
