"""The code version written into every checkpoint manifest: a hash of the executor bundle's source."""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

import executors

_ROOT = Path(executors.__file__).resolve().parent.parent


@functools.cache
def code_version() -> str:
    """``VERSION+HASH`` where HASH covers every .py file of executors/ and protocol/."""
    h = hashlib.sha256()
    for package in ("executors", "protocol"):
        for path in sorted((_ROOT / package).rglob("*.py")):
            h.update(str(path.relative_to(_ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    return f"{executors.__version__}+{h.hexdigest()[:12]}"
