"""The code version written into every checkpoint manifest: the bundle's content hash."""

from __future__ import annotations

import functools
from pathlib import Path

import executors
from protocol.version import source_hash


@functools.cache
def code_version() -> str:
    """``VERSION+HASH``; HASH is the same one the console deploys the bundle under."""
    return (
        f"{executors.__version__}+{source_hash(Path(executors.__file__).resolve().parent.parent)}"
    )
