"""The executor bundle's content hash: what the console deploys and what every manifest records."""

from __future__ import annotations

import hashlib
from pathlib import Path

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
